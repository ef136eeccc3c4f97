"""What is done with a target, above the declarations in ``targets/``: the target's estimate of a mapped model
(``estimate``), exploration scored by the vendor's own compiler (``explore``), the vendor toolchain's build
and simulator run on the bundle (``toolchain_run``), and the manifest as the deploy contract
(``deploy_manifest``).

``targets/`` says what a target is (specs, adapters, legalisations, forms, templates, toolchains); these modules
read those declarations and run them. Nothing here names a vendor: what differs per vendor is an attribute or
method of its adapter (its int8 stand-in format, its QDQ load text, its vendor cost, its forms).
"""
