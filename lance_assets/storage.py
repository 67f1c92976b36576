"""Local folders and object storage (``s3://``, ``gs://``, ``az://``) behind one set of calls.

The data root (``LANCE_ASSETS_DATA``) may be a local folder or an object-store URI. Everything
under it goes through this module: Lance datasets take the URI and ``storage_options_for``, and
every other file (checkpoints, tokenizers, samples, reports, pointers) is a ``pathlib.Path``
(local) or a ``upath.UPath`` over fsspec (object storage) written with ``write_atomic``.

Credentials never travel as arguments. Lance (object_store) and fsspec (s3fs/gcsfs/adlfs) both
read the standard environment variables themselves (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ALLOW_HTTP``, ``GOOGLE_APPLICATION_CREDENTIALS``,
``AZURE_STORAGE_ACCOUNT_NAME``/``AZURE_STORAGE_ACCOUNT_KEY`` ...), so no secret is ever held in
the table's config, a run's config, Dagster metadata, a checkpoint or a pickled loader state.
A URI that carries a secret itself (``s3://KEY:SECRET@bucket``, ``?secret=``) is refused.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Union
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from upath import UPath

# Schemes served by fsspec + Lance's object_store. ``file://`` and plain paths are local.
OBJECT_STORE_SCHEMES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"}

Location = Union[Path, "UPath"]


class StorageConfigError(ValueError):
    """A data root or its environment that cannot work; the message names the fix."""


def scheme(uri: str | os.PathLike) -> str:
    """``s3``, ``gs``, ``az``, ... for object-store URIs; ``""`` for local paths."""
    if isinstance(uri, Path):
        return ""
    text = str(uri)
    if "://" not in text:
        return ""
    found = text.split("://", 1)[0].lower()
    return "" if found == "file" else found


def is_object_store(uri: str | os.PathLike) -> bool:
    protocol = getattr(uri, "protocol", None)  # a UPath
    if protocol is not None:
        return protocol not in ("", "file", "local")
    return scheme(uri) in OBJECT_STORE_SCHEMES


def check_uri(uri: str) -> None:
    """Refuse object-store URIs we cannot serve or that carry credentials, naming the fix."""
    found = scheme(uri)
    if found and found not in OBJECT_STORE_SCHEMES:
        raise StorageConfigError(
            f"{uri!r}: unsupported scheme {found!r}; use a local path or one of "
            f"{', '.join(sorted(OBJECT_STORE_SCHEMES))}://bucket/prefix")
    parts = urlsplit(uri)
    if "@" in parts.netloc or parts.query or parts.fragment:
        raise StorageConfigError(
            "LANCE_ASSETS_DATA must not carry credentials or options in the URI (user:secret@, "
            "?key=...): it is recorded in run config, metadata and checkpoints. Give the bare "
            "bucket/prefix and put credentials in the standard environment variables "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...; see docs/object-storage.md).")
    if not parts.netloc:
        raise StorageConfigError(f"{uri!r}: no bucket; expected {found}://bucket[/prefix]")
    if found in ("s3", "s3a"):
        endpoint = (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
                    or os.environ.get("AWS_ENDPOINT") or "")
        allow = os.environ.get("AWS_ALLOW_HTTP", "").strip().lower() in ("1", "true", "yes")
        if endpoint.startswith("http://") and not allow:
            raise StorageConfigError(
                f"AWS_ENDPOINT_URL={endpoint} is plain HTTP, which Lance refuses by default: set "
                "AWS_ALLOW_HTTP=true (a local MinIO or test server), or use an https:// endpoint.")


def storage_options_for(uri: str | os.PathLike) -> dict[str, str]:
    """The ``storage_options`` to hand Lance (``lance.dataset``, ``write_dataset``,
    ``LanceDataset.commit``, ``write_fragments``, ``lancedb.connect``) for ``uri``.

    Lance 14 / lancedb 0.40 read every standard variable from the environment by themselves
    (endpoint, region, key, secret, session token, allow-http; checked against an S3 server), so
    the answer is empty on purpose: passing credentials here would copy them into objects that
    get pickled (loader workers) or logged. The call still validates the URI and environment so
    a misconfiguration fails here, with the fix, instead of as an opaque I/O error.
    """
    if is_object_store(uri):
        check_uri(str(uri))
    return {}


def location(uri: str | os.PathLike) -> Location:
    """``uri`` as a path object: a ``Path`` for local paths (``~`` expanded), a ``UPath`` over
    fsspec for object storage. Listings are not cached: several processes write the same
    prefixes (trainer ranks, the Dagster run), and a cached listing would hide their files."""
    if hasattr(uri, "protocol") and hasattr(uri, "fs"):  # already a UPath
        return uri
    if isinstance(uri, Path):
        return uri
    text = os.fspath(uri)
    if text.startswith("file://"):
        return Path(text[len("file://"):]).expanduser()
    if not is_object_store(text):
        if scheme(text):
            check_uri(text)  # an unknown scheme: refused with the list of supported ones
        return Path(text).expanduser()
    check_uri(text)
    from upath import UPath

    return UPath(text.rstrip("/"), use_listings_cache=False)


def uri_of(path: Location | str) -> str:
    """The string Lance, fsspec and a subprocess's command line take for ``path``."""
    return str(path)


def write_atomic(path: Location | str, data: bytes) -> None:
    """Make ``data`` the whole content of ``path``, or leave the old content: never a prefix.

    Local: a hidden temp file in the same folder, fsynced, renamed over ``path`` with
    ``os.replace``, then the folder fsynced so the rename survives a power cut. Object storage:
    one PUT (a multipart upload above 100 MB), which S3, GCS and Azure publish atomically on
    completion: a reader sees the old object or the new one, and a killed upload leaves none.
    """
    path = location(path)
    if is_object_store(path):
        path.fs.pipe_file(path.path, data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_partial_writes(folder: Location | str, name_glob: str = "*") -> int:
    """Delete temp files that killed ``write_atomic`` calls left in ``folder`` (local only:
    object storage has none). Returns how many were removed."""
    folder = location(folder)
    if is_object_store(folder) or not folder.is_dir():
        return 0
    n = 0
    for stale in folder.glob(f".{name_glob}.tmp-*"):
        stale.unlink(missing_ok=True)
        n += 1
    return n


def remove_tree(folder: Location | str) -> int:
    """Delete ``folder`` and everything under it (local or object storage); returns how many
    files it held (0 when absent)."""
    folder = location(folder)
    if is_object_store(folder):
        if not folder.exists():
            return 0
        files = len(folder.fs.find(folder.path))
        folder.fs.rm(folder.path, recursive=True)
        return files
    if not folder.exists():
        return 0
    import shutil

    files = sum(1 for p in folder.rglob("*") if p.is_file())
    shutil.rmtree(folder)
    return files


def read_bytes(path: Location | str) -> bytes:
    return location(path).read_bytes()


def read_ranges(path: Location | str, ranges: list[tuple[int, int]],
                into: list[memoryview | None] | None = None) -> list[bytes | memoryview]:
    """The bytes ``[start, end)`` of each range of one file (local: ``pread``; object storage:
    fsspec's ranged reads). A range past the end of the file comes back short. ``into``: a
    buffer per range (or None) to read it into, returned as the view of what was read."""
    where = path if isinstance(path, str) and not is_object_store(path) else location(path)
    into = into or [None] * len(ranges)
    if is_object_store(where):
        got = where.fs.cat_ranges([where.path] * len(ranges), [a for a, _ in ranges],
                                  [b for _, b in ranges])
        out: list[bytes | memoryview] = []
        for data, buf in zip(got, into):
            if buf is not None:
                buf[:len(data)] = data
                data = buf[:len(data)]
            out.append(data)
        return out
    fd = os.open(os.fspath(where), os.O_RDONLY)
    try:
        return [os.pread(fd, b - a, a) if buf is None else buf[:os.preadv(fd, [buf[:b - a]], a)]
                for (a, b), buf in zip(ranges, into)]
    finally:
        os.close(fd)


def read_scattered(path: Location | str, start: int, buffers: list[memoryview]) -> int:
    """Fill ``buffers`` in order with the file's bytes from ``start`` on (local: one
    ``preadv``); returns how many bytes were read (short: the file ended first)."""
    where = path if isinstance(path, str) and not is_object_store(path) else location(path)
    if is_object_store(where):
        total = sum(len(b) for b in buffers)
        data = memoryview(where.fs.cat_file(where.path, start=start, end=start + total))
        at = 0
        for buf in buffers:
            part = data[at:at + len(buf)]
            buf[:len(part)] = part
            at += len(part)
        return at
    fd = os.open(os.fspath(where), os.O_RDONLY)
    try:
        return os.preadv(fd, buffers, start)
    finally:
        os.close(fd)


def append_text(path: Location | str, text: str) -> None:
    """Append ``text`` to a small log file (training metrics). Local: an ``a``-mode write.
    Object storage has no append: the file is read and written back whole with one PUT, so a
    reader never sees a torn line; meant for files of kilobytes, not for bulk data."""
    path = location(path)
    if not is_object_store(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(text)
        return
    old = path.read_bytes() if path.exists() else b""
    write_atomic(path, old + text.encode("utf-8"))


# ---------------------------------------------------------------------------------------------
# An exclusive lease on object storage, where there is no flock.

# Backends whose fsspec ``pipe_file(mode="create")`` is one conditional request, so exactly one
# of two racing creators wins: S3 (``If-None-Match: *``, checked against an S3 server). gcsfs
# and adlfs are not checked here; for them the lease is refused rather than silently racy.
EXCLUSIVE_CREATE_SCHEMES = {"s3", "s3a"}

LEASE_TTL_S = 60.0
LEASE_TTL_ENV = "LANCE_ASSETS_LEASE_TTL_S"  # overrides LEASE_TTL_S (seconds)


class LeaseLost(RuntimeError):
    """The lease expired or another owner took it over: stop before the next commit."""


class ObjectLease:
    """Exclusive right to one job (e.g. ingest) among processes that share only a bucket.

    The lease is a folder of generation objects ``000000000001.json``, ``...2.json``. Taking it
    means creating the next generation with a create-if-absent PUT, so of two racing takers
    exactly one wins. Generations are never deleted, so no generation can be created twice: a
    taker that looked at the folder long ago and tries to create a generation someone has
    created since fails, and looks again. The newest generation rules: it is held while its
    ``expires`` (wall clock, seconds) is in the future and it is not marked released. The holder
    rewrites its own object with a later ``expires`` every ``ttl_s / 4``; a holder that dies
    stops renewing, and after ``ttl_s`` the next taker creates the following generation.
    ``check()`` looks for a newer generation itself (one request) and fails once there is one,
    or once the holder could not renew in time: call it before every commit, so a stalled holder
    that was taken over stops instead of doing work that would be thrown away.

    The lease saves wasted work; it is not what keeps ingest exactly-once (its commits are, see
    ``corpus.ingest``). Clocks that disagree, or a holder frozen between ``check()`` and its
    commit, can let two holders work at once; the commit fence then rejects the stale one.
    """

    def __init__(self, folder: Location | str, owner: str, *, ttl_s: float | None = None,
                 poll_s: float = 1.0, log=print):
        self.folder = location(folder)
        if not is_object_store(self.folder):
            raise StorageConfigError(f"{folder}: ObjectLease is for object storage; use a file lock")
        if self.folder.protocol not in EXCLUSIVE_CREATE_SCHEMES:
            raise StorageConfigError(
                f"{folder}: an exclusive lease needs a create-if-absent write, verified here only "
                f"for S3 ({', '.join(sorted(EXCLUSIVE_CREATE_SCHEMES))}). Run this job with the "
                "data on S3 or a local/NFS folder, or see docs/object-storage.md.")
        self.owner = f"{owner} [{secrets.token_hex(4)}]"
        if ttl_s is None:
            ttl_s = float(os.environ.get(LEASE_TTL_ENV) or LEASE_TTL_S)
        self.ttl_s, self.poll_s, self.log = ttl_s, poll_s, log
        self.generation: int | None = None
        self.waited_s = 0.0
        self._renewed_at = 0.0
        self._lost: str | None = None
        self._stop = None
        self._thread = None

    # -- the objects
    @property
    def _fs(self):
        return self.folder.fs

    def _name(self, gen: int) -> str:
        return f"{self.folder.path}/{gen:012d}.json"

    def _generations(self) -> list[int]:
        try:
            names = self._fs.ls(self.folder.path, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            stem = name.rsplit("/", 1)[-1].removesuffix(".json")
            if stem.isdigit():
                out.append(int(stem))
        return sorted(out)

    def _exists(self, gen: int) -> bool:
        try:
            self._fs.info(self._name(gen), refresh=True)
            return True
        except FileNotFoundError:
            return False

    def _newest(self, known: int) -> int:
        """The newest generation, knowing that ``known`` exists (0: nothing known yet; the
        folder is listed once). Generations above a known one are contiguous: each is created
        only as the successor of an existing one, and none is ever deleted."""
        if known == 0:
            gens = self._generations()
            known = gens[-1] if gens else 0
        while self._exists(known + 1):
            known += 1
        return known

    def _record(self, released: bool = False) -> bytes:
        import json

        return json.dumps({"owner": self.owner, "expires": time.time() + self.ttl_s,
                           "released": released}).encode()

    def _holder(self, gen: int) -> dict | None:
        """The record of ``gen`` when it is still held, else None."""
        import json

        try:
            record = json.loads(self._fs.cat_file(self._name(gen)))
        except FileNotFoundError:
            return None
        except ValueError:  # not ours or torn by hand: treat as expired rather than block forever
            return None
        if record.get("released") or float(record.get("expires", 0)) <= time.time():
            return None
        return record

    # -- the protocol
    def acquire(self) -> float:
        """Block until the lease is ours; returns the seconds waited."""
        start = time.perf_counter()
        told = None
        top = 0
        while True:
            top = self._newest(top)
            holder = self._holder(top) if top else None
            if holder is None:
                try:
                    self._fs.pipe_file(self._name(top + 1), self._record(), mode="create")
                except FileExistsError:
                    continue  # another taker created it first: look again
                if self._exists(top + 2):  # taken over already (clocks far apart): not ours
                    top += 1
                    continue
                self.generation = top + 1
                self._renewed_at = time.monotonic()
                self._start_renewing()
                self.waited_s = time.perf_counter() - start
                return self.waited_s
            if told != holder["owner"]:
                self.log(f"another process holds the lease {self.folder} ({holder['owner']}, "
                         f"expires in {float(holder['expires']) - time.time():.0f} s unless "
                         "renewed); waiting for it")
                told = holder["owner"]
            time.sleep(self.poll_s)

    def _start_renewing(self) -> None:
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renewal", daemon=True)
        self._thread.start()

    def _taken_over(self) -> str | None:
        if self._exists(self.generation + 1):
            return (f"lease {self.folder} was taken over (generation {self.generation + 1}) "
                    "after this process failed to renew it in time")
        return None

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                lost = self._taken_over()
                if lost:
                    self._lost = lost
                    return
                self._fs.pipe_file(self._name(self.generation), self._record())
                self._renewed_at = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - a network blip: check() decides if it matters
                self.log(f"lease {self.folder}: renewal failed ({exc}); retrying")

    def check(self) -> None:
        """Raise ``LeaseLost`` unless the lease is still surely ours."""
        if self.generation is None:
            raise LeaseLost(f"lease {self.folder} is not held")
        if self._lost:
            raise LeaseLost(self._lost)
        self._lost = self._taken_over()
        if self._lost:
            raise LeaseLost(self._lost)
        # renewals keep the lease ttl_s past the last success; stop with a margin before that
        if time.monotonic() - self._renewed_at > self.ttl_s * 0.75:
            raise LeaseLost(f"lease {self.folder} could not be renewed for "
                            f"{time.monotonic() - self._renewed_at:.0f} s; stopping before it "
                            "expires and another process takes it")

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
        if self.generation is not None and not self._lost:
            try:
                self._fs.pipe_file(self._name(self.generation), self._record(released=True))
            except Exception as exc:  # noqa: BLE001 - it expires on its own after ttl_s
                self.log(f"lease {self.folder}: release failed ({exc}); it expires in "
                         f"{self.ttl_s:.0f} s")
        self.generation = None

    def __enter__(self) -> ObjectLease:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
