"""``Runtime``: serve a Flex-DSA bundle. Pick the bucket, pad, run the best runtime present, crop back, count.

    rt = Runtime.open("bundle.zip")                       # or a folder; checksums verified first
    outputs = rt.run({"input_ids": ids, "attention_mask": mask})
    rt.traffic.snapshot()                                  # the shapes served, for POST /jobs/{id}/traffic
    rt.update("bundle-v2.zip")                             # verified, loaded, then switched in one step

A zip is unpacked within ``unpack_limits`` (``bundle.UnpackLimits``: 8 GiB and 10,000 members by default).
``provider_options`` are the accelerator EP's options set in code, trusted as such (QNN's ``backend_path``, the
library to load, only comes this way); the manifest's own are allow-listed (``backends.qnn``).

With ``store=`` a folder, versions are kept on disk (``versions.VersionStore``) and the one in service
survives a restart: ``Runtime.open(store=root)`` reopens it (verifying it again). ``update`` installs the new
version (verified), loads every bucket, and only then switches, first on disk (one atomic rename) and then in
memory (one reference swap): a request sees the old version or the new, never half of each, and a process
killed mid-update restarts on a complete version.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flexdsa_runtime.backends import load_backend
from flexdsa_runtime.backends.base import Backend
from flexdsa_runtime.bundle import Bundle, UnpackLimits, open_bundle, unpack
from flexdsa_runtime.errors import BundleError, ShapeRefused
from flexdsa_runtime.served import serve
from flexdsa_runtime.shapes import ShapePolicy, lost_shapes
from flexdsa_runtime.traffic import Traffic
from flexdsa_runtime.versions import VersionStore


@dataclass
class _Served:
    """One version in service: the bundle, its policy and its loaded buckets (swapped as a whole)."""

    bundle: Bundle
    policy: ShapePolicy
    backends: dict[str, Backend] = field(default_factory=dict)
    scratch: Path | None = None  # an unpacked zip outside any store, removed when retired

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


@dataclass
class Timing:
    """Where ``run`` spent its time, summed over the requests the version in service ran: the backend's run and
    the runtime's own work around it (bucket choice, padding, cropping, counting). Not locked: under concurrent
    requests the sums are approximate."""

    requests: int = 0
    total_s: float = 0.0
    backend_s: float = 0.0

    @property
    def overhead_s(self) -> float:
        return self.total_s - self.backend_s


class Runtime:
    def __init__(
        self,
        served: _Served,
        *,
        backend: str,
        threads: int | None,
        store: VersionStore | None,
        unpack_limits: UnpackLimits | None = None,
        provider_options: dict[str, str] | None = None,
    ) -> None:
        self._served = served
        self._backend = backend
        self._threads = threads
        self._store = store
        self._unpack_limits = unpack_limits
        self._provider_options = dict(provider_options or {})
        self._load_lock = threading.Lock()
        self._update_lock = threading.Lock()
        self.traffic = Traffic(served.bundle.version, served.bundle.target)
        self.timing = Timing()

    # ---- opening -------------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        bundle: str | Path | None = None,
        *,
        store: str | Path | None = None,
        backend: str = "auto",
        threads: int | None = None,
        preload: bool = True,
        unpack_limits: UnpackLimits | None = None,
        provider_options: dict[str, str] | None = None,
    ) -> Runtime:
        """Serve ``bundle`` (folder or zip); with ``store``, install it there and switch to it, or with no
        ``bundle`` reopen the store's version in service. Every file is verified before anything is loaded.
        A zip is unpacked within ``unpack_limits``; ``provider_options`` go to the accelerator's execution
        provider on top of the manifest's (see the module's docstring)."""
        versions = VersionStore(Path(store)) if store is not None else None
        if versions is not None:
            versions.clean_staging()
            if bundle is not None:
                versions.switch(versions.install(Path(bundle), limits=unpack_limits))
            served = _Served(*cls._policy(versions.open_current()))
        elif bundle is None:
            raise ValueError("give a bundle (folder or zip), a store, or both")
        else:
            served = cls._unpacked(Path(bundle), unpack_limits)
        runtime = cls(
            served,
            backend=backend,
            threads=threads,
            store=versions,
            unpack_limits=unpack_limits,
            provider_options=provider_options,
        )
        if preload:
            runtime._load_all(served)
        return runtime

    @staticmethod
    def _policy(bundle: Bundle) -> tuple[Bundle, ShapePolicy]:
        return bundle, ShapePolicy(bundle.runtime, bundle.buckets)

    @classmethod
    def _unpacked(cls, path: Path, limits: UnpackLimits | None) -> _Served:
        if path.is_dir():
            return _Served(*cls._policy(open_bundle(path)))
        scratch = Path(tempfile.mkdtemp(prefix="flexdsa-bundle-"))
        try:
            unpack(path, scratch, limits=limits)
            return _Served(*cls._policy(open_bundle(scratch)), scratch=scratch)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise

    def _backend_for(self, served: _Served, bucket) -> Backend:
        backend = served.backends.get(bucket.name)
        if backend is None:
            with self._load_lock:
                backend = served.backends.get(bucket.name)
                if backend is None:
                    backend = load_backend(
                        served.bundle,
                        bucket,
                        self._backend,
                        threads=self._threads,
                        provider_options=self._provider_options,
                    )
                    served.backends[bucket.name] = backend
        return backend

    def _load_all(self, served: _Served) -> None:
        for bucket in served.policy.buckets:
            self._backend_for(served, bucket)

    # ---- what is in service ------------------------------------------------------------------------
    @property
    def bundle(self) -> Bundle:
        return self._served.bundle

    @property
    def version(self) -> str:
        return self._served.bundle.version

    def backend_names(self) -> dict[str, str]:
        """Which runtime serves each loaded bucket."""
        return {name: backend.name for name, backend in self._served.backends.items()}

    # ---- serving -------------------------------------------------------------------------------------
    def bucket_for(self, inputs: dict[str, Any]) -> str:
        """The bucket ``run`` would take for these inputs (``ShapeRefused`` when none), without running it."""
        return self._served.policy.choose({k: np.asarray(v) for k, v in inputs.items()}).bucket.name

    def run(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        """The model's outputs on ``inputs`` (by input name), at the request's own shape."""
        started = time.perf_counter()
        served = self._served  # one version for the whole request, whatever an update does meanwhile
        arrays = {name: np.asarray(value) for name, value in inputs.items()}
        try:
            choice = served.policy.choose(arrays)
        except ShapeRefused as refusal:
            dims = refusal.details.get("dims")
            if dims:
                self.traffic.record(dims, None, sum(a.size for a in arrays.values()), 0)
            raise
        backend = self._backend_for(served, choice.bucket)
        feeds = served.policy.pad(arrays, choice, backend.input_dtypes)
        backend_started = time.perf_counter()
        outputs = backend.run(feeds)
        backend_s = time.perf_counter() - backend_started
        outputs = served.policy.crop_outputs(outputs, choice)
        if choice.bucket.served:  # outputs the compiled artifact leaves to the runtime (an input passed through)
            outputs = {**serve(choice.bucket.served, arrays), **outputs}
        self.traffic.record(choice.dims, choice.bucket.name, choice.elements, choice.padded_elements)
        timing = self.timing
        timing.requests += 1
        timing.backend_s += backend_s
        timing.total_s += time.perf_counter() - started
        return outputs

    # ---- updating ------------------------------------------------------------------------------------
    def update(self, bundle: str | Path, *, accept_narrower: bool = False) -> dict[str, Any]:
        """Switch to the bundle at ``bundle`` (folder or zip): verified and fully loaded before the switch; on
        any error the runtime stays on its current version. A bundle that serves fewer shapes than the one in
        service (a smaller largest bucket, an exact size gone) is refused with ``BundleError`` naming them,
        unless ``accept_narrower``. Returns the new version and the old version's traffic (not yet sent) and
        timing; the new version counts both afresh."""
        with self._update_lock:
            old = self._served
            if self._store is not None:
                version = self._store.install(Path(bundle), limits=self._unpack_limits)
                new = _Served(*self._policy(open_bundle(self._store.folder(version), check=False)))
            else:
                new = self._unpacked(Path(bundle), self._unpack_limits)
            try:
                lost = lost_shapes(old.policy, new.policy)
                if lost and not accept_narrower:
                    raise BundleError(
                        f"version {new.bundle.version} serves fewer shapes than version {old.bundle.version} in "
                        "service: it would refuse "
                        + "; ".join(f"{dim} {values}" for dim, values in lost.items())
                        + ". Re-specialise keeping those sizes, or pass accept_narrower=True to accept it.",
                        details={"lost": lost, "version": new.bundle.version, "serving": old.bundle.version},
                    )
                self._load_all(new)
            except BaseException:
                new.close()
                raise
            if self._store is not None:
                self._store.switch(new.bundle.version)
            previous, timing = self.traffic.snapshot(), self.timing
            self.traffic = Traffic(new.bundle.version, new.bundle.target)
            self.timing = Timing()
            self._served = new
        old.close()
        return {
            "version": new.bundle.version,
            "previous_version": old.bundle.version,
            "previous_traffic": previous,
            "previous_timing": timing,
        }

    def close(self) -> None:
        self._served.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
