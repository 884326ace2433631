"""The sidecar's wire (kvbm/sidecar in the Go tree, docs/engines.md).

A frame is an 8-byte header -- b"KB", the wire version, the kind (1
request, 2 reply, 3 error), the payload length as a big-endian uint32 --
and a JSON payload. One request, one reply, in order.

Every call is bounded by the client's timeout. A sidecar that is down or
slow never stalls the engine: the call fails with SidecarError, the
failure is counted, and the client stays away for ``retry_s`` before it
dials again, so the engine pays the timeout once, not on every call.
"""

import json
import os
import socket
import struct
import threading
import time

VERSION = 1
KIND_REQUEST, KIND_REPLY, KIND_ERROR = 1, 2, 3
_HEADER = struct.Struct(">2sBBI")
MAX_PAYLOAD = 16 << 20


def default_socket():
    """The sidecar's socket: $KVMESH_KVBM_SOCKET, else the worker's
    default path for this user."""
    return os.environ.get("KVMESH_KVBM_SOCKET") or "/tmp/kvmesh-kvbm-%d.sock" % os.getuid()


class SidecarError(Exception):
    """A call the sidecar did not answer (down, slow) or refused."""

    def __init__(self, msg, code="unavailable"):
        super().__init__(msg)
        self.code = code


class Client:
    """A connection to the sidecar, redialled on demand.

    ``errors`` counts failed calls by code (``timeout``, ``unavailable``,
    ``bad_request``, ...). Safe for use from several threads (calls are
    serialised).
    """

    def __init__(self, path=None, shape="vllm", role="scheduler", timeout_s=None, retry_s=1.0):
        # A path someone configured is trusted as given; the default one
        # (in a shared /tmp) only if this user or root owns the socket.
        self.explicit = bool(path or os.environ.get("KVMESH_KVBM_SOCKET"))
        self.path = path or default_socket()
        self.shape, self.role = shape, role
        if timeout_s is None:
            timeout_s = float(os.environ.get("KVMESH_KVBM_TIMEOUT_S", "2"))
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self.errors = {}
        self.calls = 0
        self._sock = None
        self._down_until = 0.0
        self._lock = threading.Lock()
        self.on_reconnect = None  # called (under the lock) after a redial's hello

    def close(self):
        with self._lock:
            self._drop()

    def _drop(self):
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def _count(self, code):
        self.errors[code] = self.errors.get(code, 0) + 1

    def error_count(self):
        return sum(self.errors.values())

    def _dial(self):
        if not self.explicit:
            owner = os.stat(self.path).st_uid
            if owner not in (os.getuid(), 0):
                raise SidecarError("%s is owned by uid %d, not this user: set KVMESH_KVBM_SOCKET to trust it" % (self.path, owner),
                                   "untrusted")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout_s)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            raise
        self._sock = s
        reply = self._roundtrip({"op": "hello", "shape": self.shape, "role": self.role})
        if self.on_reconnect is not None:
            self.on_reconnect(reply)
        return reply

    def _roundtrip(self, req):
        body = json.dumps(req, separators=(",", ":")).encode()
        self._sock.sendall(_HEADER.pack(b"KB", VERSION, KIND_REQUEST, len(body)) + body)
        hdr = self._recv(_HEADER.size)
        magic, version, kind, n = _HEADER.unpack(hdr)
        if magic != b"KB" or version != VERSION or n > MAX_PAYLOAD:
            raise SidecarError("reply header %r out of step" % hdr, "bad_frame")
        payload = json.loads(self._recv(n)) if n else {}
        if kind == KIND_ERROR:
            raise SidecarError(payload.get("error", "error"), payload.get("code", "failed"))
        if kind != KIND_REPLY:
            raise SidecarError("reply of kind %d" % kind, "bad_frame")
        return payload

    def _recv(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("sidecar closed the connection")
            buf += chunk
        return bytes(buf)

    def call(self, op, **fields):
        """One call; raises SidecarError (counted) when it fails."""
        with self._lock:
            self.calls += 1
            now = time.monotonic()
            if self._sock is None and now < self._down_until:
                self._count("unavailable")
                raise SidecarError("sidecar unavailable (retrying in %.1fs)" % (self._down_until - now))
            fields["op"] = op
            try:
                if self._sock is None:
                    self._dial()
                return self._roundtrip(fields)
            except SidecarError as e:
                self._count(e.code)
                if e.code == "bad_frame":
                    self._drop()
                raise
            except socket.timeout:
                self._count("timeout")
                self._drop()
                self._down_until = time.monotonic() + self.retry_s
                raise SidecarError("sidecar timed out after %.1fs" % self.timeout_s, "timeout")
            except (OSError, ValueError) as e:
                self._count("unavailable")
                self._drop()
                self._down_until = time.monotonic() + self.retry_s
                raise SidecarError("sidecar: %s" % e)

    def try_call(self, op, **fields):
        """call, or None when it fails (already counted)."""
        try:
            return self.call(op, **fields)
        except SidecarError:
            return None
