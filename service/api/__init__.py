"""HTTP routes. Every module here exporting ``router`` is included by ``service.app.create_app``
(discovery: adding an endpoint group means adding a file)."""
