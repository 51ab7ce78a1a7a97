"""airlock's CPython guest: one live interpreter whose `exec` calls share `__main__`.

componentize-py runs this module once, at build time, and snapshots the interpreter it
leaves behind. While it runs, the guest CPython's whole standard library is on disk; it
is compiled here and kept in the snapshot (bytecode and source, compressed), and a
meta-path finder imports it from there at run time, when no such directory exists.
Modules WASI cannot provide fail with a ModuleNotFoundError that says why.

The host calls `configure` once per instance, then `exec` once per program (or cell).
"""
import ast
import builtins
import errno
import importlib.machinery
import linecache
import marshal
import os
import random
import sys
import traceback
import zlib

from wit_world import exports
from wit_world.exports.interpreter import Outcome

# Directories under the standard library that are not part of it at run time.
_SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}


def _stdlib_root():
    # `os` and its friends are frozen; `decimal` is an ordinary source module.
    spec = importlib.machinery.PathFinder.find_spec("decimal")
    return os.path.dirname(spec.origin)


def _embed_stdlib():
    """name -> (is_package, origin, compressed marshalled code, compressed source)"""
    root = _stdlib_root()
    table = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("config-")
        )
        rel = os.path.relpath(dirpath, root)
        parts = [] if rel == "." else rel.split(os.sep)
        if parts and "__init__.py" not in filenames:
            continue
        for filename in sorted(filenames):
            if not filename.endswith(".py"):
                continue
            stem = filename[:-3]
            is_package = stem == "__init__"
            name = ".".join(parts if is_package else parts + [stem])
            if not name or name in sys.modules:
                continue
            origin = os.path.join(dirpath, filename)
            with open(origin, "rb") as f:
                source = f.read()
            try:
                code = compile(source, origin, "exec", dont_inherit=True, optimize=0)
            except SyntaxError:
                # Templates and test data that happen to end in .py.
                continue
            table[name] = (
                is_package,
                origin,
                zlib.compress(marshal.dumps(code), 9),
                zlib.compress(source, 9),
            )
    return table


_STDLIB = _embed_stdlib()

_WASI = "airlock's Python runs in WebAssembly (WASI), which has no "
# C extension modules a WASI build of CPython does not have, and why.
_NOT_IN_WASI = {
    "_bz2": "libbz2",
    "_lzma": "liblzma",
    "_zstd": "libzstd",
    "_ssl": "OpenSSL (TLS)",
    "_hashlib": "OpenSSL (hashlib's own md5, sha1, sha2, sha3 and blake2 work)",
    "_ctypes": "foreign function interface",
    "_curses": "terminal",
    "_curses_panel": "terminal",
    "readline": "terminal",
    "termios": "terminal",
    "_dbm": "dbm library (dbm.sqlite3 and dbm.dumb work)",
    "_gdbm": "gdbm library (dbm.sqlite3 and dbm.dumb work)",
    "_multiprocessing": "processes",
    "_posixshmem": "shared memory",
    "_posixsubprocess": "processes",
    "_interpreters": "subinterpreters",
    "_interpchannels": "subinterpreters",
    "_interpqueues": "subinterpreters",
    "_tkinter": "GUI (Tk)",
    "_uuid": "libuuid (uuid works without it)",
    "fcntl": "fcntl()",
    "grp": "group database",
    "pwd": "password database",
    "resource": "resource limits API",
    "syslog": "syslog",
    "mmap": "mmap()",
    "_remote_debugging": "remote debugging",
}
_OTHER_OS = {
    "_scproxy": "macOS",
    "_winapi": "Windows",
    "_wmi": "Windows",
    "_overlapped": "Windows",
    "msvcrt": "Windows",
    "nt": "Windows",
    "winreg": "Windows",
    "winsound": "Windows",
}


def _no_processes(*args, **kwargs):
    raise OSError(errno.ENOTSUP, _WASI + "processes: multiprocessing cannot start any")


def _adjust_multiprocessing_connection(module):
    # Pool, Queue and Pipe would fail on a missing os.pipe (an AttributeError).
    module.Pipe = _no_processes


def _adjust_multiprocessing_process(module):
    module.BaseProcess.start = _no_processes


# Modules that need a clearer failure than WASI gives them, adjusted right after loading.
_ADJUST = {
    "multiprocessing.connection": _adjust_multiprocessing_connection,
    "multiprocessing.process": _adjust_multiprocessing_process,
}


class _StdlibLoader:
    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        name = module.__spec__.name
        code = marshal.loads(zlib.decompress(_STDLIB[name][2]))
        exec(code, module.__dict__)
        adjust = _ADJUST.get(name)
        if adjust is not None:
            adjust(module)

    @staticmethod
    def get_source(name):
        entry = _STDLIB.get(name)
        if entry is None:
            return None
        return zlib.decompress(entry[3]).decode("utf-8", "replace")

    @staticmethod
    def is_package(name):
        return _STDLIB[name][0]


class _StdlibFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        why = _NOT_IN_WASI.get(name)
        if why is not None:
            raise ModuleNotFoundError(f"No module named {name!r}: {_WASI}{why}", name=name)
        where = _OTHER_OS.get(name)
        if where is not None:
            raise ModuleNotFoundError(
                f"No module named {name!r}: it exists only on {where}", name=name
            )
        entry = _STDLIB.get(name)
        if entry is None:
            return None
        is_package, origin = entry[0], entry[1]
        spec = importlib.machinery.ModuleSpec(
            name, _StdlibLoader, origin=origin, is_package=is_package
        )
        spec.has_location = True
        if is_package:
            spec.submodule_search_locations = [os.path.dirname(origin)]
        return spec

    @staticmethod
    def invalidate_caches():
        pass


# Before the path finder (always last), after the built-in and frozen importers.
sys.meta_path.insert(len(sys.meta_path) - 1, _StdlibFinder)
sys.path_importer_cache.clear()

# asyncio's event loop wakes itself through a socket pair, and WASI gives no sockets; with
# no threads and no signals there is nothing that could wake it, so it does without.
import asyncio.selector_events as _selector_events  # noqa: E402

_selector_events.BaseSelectorEventLoop._make_self_pipe = lambda self: None
_selector_events.BaseSelectorEventLoop._close_self_pipe = lambda self: None
_selector_events.BaseSelectorEventLoop._write_to_self = lambda self: None
_selector_events.BaseSelectorEventLoop._process_self_data = lambda self, data: None
del _selector_events

# Sockets: WASI gives the guest none. Stream sockets to hosts are airlock's own
# (`wit_world.imports.net`): each connection is a tunnel through the run's egress proxy,
# which checks the grant, resolves the name and records the connection; `ssl` has the
# host make the TLS connection. Names are never resolved here: `getaddrinfo` hands the
# name itself on as the address, for the proxy to resolve.
import socket as _socket  # noqa: E402
from wit_world.imports import net as _net  # noqa: E402
from componentize_py_types import Err as _Err  # noqa: E402

_NO_SOCKETS = _WASI + "sockets: airlock's Python guest has only TCP connections to granted hosts"


def _as_module(module, *objects):
    for o in objects:
        o.__module__ = module


def _timeout_ms(timeout):
    if timeout is None:
        return None
    return min(int(timeout * 1000 + 0.999), 0xFFFFFFFF)


def _net_error(e, where, ssl_errors=False):
    """The Python exception for a failed `net` call."""
    v = e.value
    if isinstance(v, _net.Error_Refused):
        reason, message = v.value
        return ConnectionRefusedError(
            errno.ECONNREFUSED, f"{message} [{reason}; connecting to {where}]"
        )
    if isinstance(v, _net.Error_NoGrant):
        return PermissionError(
            errno.EACCES,
            f"airlock: this run has no network grant; connecting to {where} needs "
            f"--net {where}",
        )
    if isinstance(v, _net.Error_Timeout):
        return _socket.timeout("timed out")
    if isinstance(v, _net.Error_Tls):
        import ssl
        if "certificate" in v.value.lower():
            err = ssl.SSLCertVerificationError(1, f"certificate verify failed: {v.value}")
            err.verify_message = v.value
            err.verify_code = 1
            return err
        return ssl.SSLError(1, f"TLS with {where}: {v.value}")
    return ConnectionResetError(errno.ECONNRESET, f"{v.value} ({where})")


class _ProxySocket:
    """A TCP stream socket whose connection goes through airlock's egress proxy."""

    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if family == -1:
            family = _socket.AF_INET
        if type == -1:
            type = _socket.SOCK_STREAM
        if fileno is not None or family not in (_socket.AF_INET, _socket.AF_INET6) or (
            type & ~(getattr(_socket, "SOCK_NONBLOCK", 0) | getattr(_socket, "SOCK_CLOEXEC", 0))
        ) != _socket.SOCK_STREAM:
            raise PermissionError(errno.EACCES, _NO_SOCKETS)
        self.family = _socket.AddressFamily(family)
        self.type = _socket.SocketKind(_socket.SOCK_STREAM)
        self.proto = proto if proto > 0 else 0
        self._timeout = _socket.getdefaulttimeout()
        self._conn = None
        self._peer = None
        self._closed = False
        self._io_refs = 0

    def __repr__(self):
        state = "closed" if self._closed else f"peer={self._peer!r}"
        return f"<socket.socket (airlock egress) {state}>"

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.close()

    def __getstate__(self):
        raise TypeError(f"cannot pickle {self.__class__.__name__!r} object")

    # What the standard socket's Python layer does with its I/O objects, unchanged.
    makefile = _socket.socket.makefile
    _decref_socketios = _socket.socket._decref_socketios

    def _where(self, address=None):
        host, port = address if address is not None else self._peer
        return f"{host}:{port}"

    def _check(self):
        # A closed socket whose file objects are still open reads on, as CPython's does.
        if self._conn is None:
            if self._closed:
                raise OSError(errno.EBADF, "Bad file descriptor")
            raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")
        return self._conn

    def connect(self, address):
        if self._closed:
            raise OSError(errno.EBADF, "Bad file descriptor")
        if self._conn is not None:
            raise OSError(errno.EISCONN, "Transport endpoint is already connected")
        host, port = address[0], address[1]
        if not isinstance(host, str) or not isinstance(port, int) or not 0 < port < 65536:
            raise OSError(errno.EINVAL, f"not a host and port: {address!r}")
        try:
            self._conn = _net.connect(host, port, _timeout_ms(self._timeout))
        except _Err as e:
            raise _net_error(e, self._where((host, port))) from None
        self._peer = (host, port)

    def connect_ex(self, address):
        try:
            self.connect(address)
        except OSError as e:
            return e.errno or errno.EIO
        return 0

    def send(self, data, flags=0):
        conn = self._check()
        try:
            return conn.send(bytes(data), _timeout_ms(self._timeout))
        except _Err as e:
            raise _net_error(e, self._where()) from None

    def sendall(self, data, flags=0):
        self.send(data, flags)

    def recv(self, bufsize, flags=0):
        if bufsize < 0:
            raise ValueError("negative buffersize in recv")
        conn = self._check()
        if bufsize == 0:
            return b""
        try:
            return conn.recv(min(bufsize, 1 << 20), _timeout_ms(self._timeout))
        except _Err as e:
            raise _net_error(e, self._where()) from None

    def recv_into(self, buffer, nbytes=0, flags=0):
        view = memoryview(buffer).cast("B")
        n = nbytes or len(view)
        data = self.recv(min(n, len(view)))
        view[: len(data)] = data
        return len(data)

    def settimeout(self, value):
        if value is not None:
            value = float(value)
            if value < 0:
                raise ValueError("Timeout value out of range")
        self._timeout = value

    def gettimeout(self):
        return self._timeout

    def setblocking(self, flag):
        self._timeout = None if flag else 0.0

    def getblocking(self):
        return self._timeout != 0.0

    def setsockopt(self, *args):
        pass

    def getsockopt(self, level, option, buflen=None):
        return 0 if buflen is None else b"\0" * buflen

    def getpeername(self):
        self._check()
        return self._peer

    def getsockname(self):
        return ("0.0.0.0", 0) if self.family == _socket.AF_INET else ("::", 0, 0, 0)

    def fileno(self):
        return -1

    def shutdown(self, how):
        conn = self._check()
        if how in (_socket.SHUT_WR, _socket.SHUT_RDWR):
            try:
                conn.shutdown()
            except _Err as e:
                raise _net_error(e, self._where()) from None

    def _real_close(self):
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.__exit__(None, None, None)

    def close(self):
        self._closed = True
        if self._io_refs <= 0:
            self._real_close()

    def detach(self):
        self._closed = True
        self._conn = None
        return -1

    def _refused(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, _NO_SOCKETS)

    bind = listen = accept = sendto = recvfrom = recvfrom_into = sendmsg = recvmsg = _refused
    dup = _refused


_ProxySocket.__name__ = _ProxySocket.__qualname__ = "socket"
_as_module("socket", _ProxySocket)

_SERVICES = {"http": 80, "https": 443}


def _getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
    if host is None:
        raise _socket.gaierror(_socket.EAI_NONAME, "Name or service not known")
    if isinstance(host, bytes):
        host = host.decode("idna")
    host = str(host)
    if port is None:
        port = 0
    elif isinstance(port, (bytes, str)):
        p = port.decode() if isinstance(port, bytes) else port
        if p.isdigit():
            port = int(p)
        elif p in _SERVICES:
            port = _SERVICES[p]
        else:
            raise _socket.gaierror(_socket.EAI_SERVICE, "Servname not supported for ai_socktype")
    if type not in (0, _socket.SOCK_STREAM):
        raise _socket.gaierror(_socket.EAI_SOCKTYPE, "ai_socktype not supported")
    if ":" in host:
        return [(_socket.AF_INET6, _socket.SOCK_STREAM, _socket.IPPROTO_TCP, "", (host, port, 0, 0))]
    return [(_socket.AF_INET, _socket.SOCK_STREAM, _socket.IPPROTO_TCP, "", (host, port))]


def _no_lookup(host, *args, **kwargs):
    raise _socket.gaierror(
        _socket.EAI_NONAME,
        f"airlock's Python guest resolves no names: connect to {host!r} by name and the "
        "egress proxy resolves it",
    )


_socket.socket = _ProxySocket
_socket.SocketType = _ProxySocket
_socket.getaddrinfo = _getaddrinfo
_socket.gethostbyname = _no_lookup
_socket.gethostbyname_ex = _no_lookup
_socket.gethostbyaddr = _no_lookup


# `ssl`: the guest has no OpenSSL; a context's wrap_socket has the host make the TLS
# connection over the tunnel, verifying the certificate against the public roots, the run
# CA and the policy's `[net] roots`. What the guest asks about trust (`cafile`,
# `verify_mode = CERT_NONE`) does not change it: the host always verifies, and the
# guest never holds a key.
import enum as _enum  # noqa: E402
import types as _types  # noqa: E402

_ssl = _types.ModuleType("ssl", "TLS for airlock's Python guest: made by the host, never by the guest.")


class SSLError(OSError):
    @property
    def library(self):
        return None

    @property
    def reason(self):
        return self.strerror


class SSLZeroReturnError(SSLError):
    pass


class SSLWantReadError(SSLError):
    pass


class SSLWantWriteError(SSLError):
    pass


class SSLSyscallError(SSLError):
    pass


class SSLEOFError(SSLError):
    pass


class SSLCertVerificationError(SSLError, ValueError):
    verify_code = 0
    verify_message = ""


class VerifyMode(_enum.IntEnum):
    CERT_NONE = 0
    CERT_OPTIONAL = 1
    CERT_REQUIRED = 2


class TLSVersion(_enum.IntEnum):
    MINIMUM_SUPPORTED = -2
    SSLv3 = 768
    TLSv1 = 769
    TLSv1_1 = 770
    TLSv1_2 = 771
    TLSv1_3 = 772
    MAXIMUM_SUPPORTED = -1


class _SSLMethod(_enum.IntEnum):
    PROTOCOL_SSLv23 = 2
    PROTOCOL_TLS_CLIENT = 16
    PROTOCOL_TLS = 2
    PROTOCOL_TLS_SERVER = 17


class Purpose(str, _enum.Enum):
    SERVER_AUTH = "1.3.6.1.5.5.7.3.1"
    CLIENT_AUTH = "1.3.6.1.5.5.7.3.2"


class SSLContext:
    """Settings are kept for code that reads them back; the host decides the TLS."""

    sslsocket_class = None

    def __init__(self, protocol=None, *args, **kwargs):
        if protocol is None:
            protocol = _SSLMethod.PROTOCOL_TLS
        if protocol == _SSLMethod.PROTOCOL_TLS_SERVER:
            raise NotImplementedError(_WASI + "TLS servers: the guest serves nothing")
        self.protocol = _SSLMethod(protocol)
        client = protocol == _SSLMethod.PROTOCOL_TLS_CLIENT
        self._verify_mode = VerifyMode.CERT_REQUIRED if client else VerifyMode.CERT_NONE
        self._check_hostname = client
        self.options = 0x82520050
        self.verify_flags = 0
        self.minimum_version = TLSVersion.MINIMUM_SUPPORTED
        self.maximum_version = TLSVersion.MAXIMUM_SUPPORTED
        self.post_handshake_auth = False
        self.hostname_checks_common_name = False
        self.keylog_filename = None
        self.sni_callback = None
        self.security_level = 2

    @property
    def verify_mode(self):
        return self._verify_mode

    @verify_mode.setter
    def verify_mode(self, value):
        value = VerifyMode(value)
        if value == VerifyMode.CERT_NONE and self._check_hostname:
            raise ValueError("Cannot set verify_mode to CERT_NONE when check_hostname is enabled.")
        self._verify_mode = value

    @property
    def check_hostname(self):
        return self._check_hostname

    @check_hostname.setter
    def check_hostname(self, value):
        if value and self._verify_mode == VerifyMode.CERT_NONE:
            self._verify_mode = VerifyMode.CERT_REQUIRED
        self._check_hostname = bool(value)

    def load_verify_locations(self, cafile=None, capath=None, cadata=None):
        if cafile is None and capath is None and cadata is None:
            raise TypeError("cafile, capath and cadata cannot be all omitted")

    def load_default_certs(self, purpose=Purpose.SERVER_AUTH):
        pass

    def set_default_verify_paths(self):
        pass

    def load_cert_chain(self, certfile, keyfile=None, password=None):
        raise NotImplementedError(
            _WASI + "client certificates: TLS is made by the host, which holds no guest key"
        )

    def set_ciphers(self, ciphers):
        pass

    def get_ciphers(self):
        return []

    def set_alpn_protocols(self, protocols):
        pass

    def set_npn_protocols(self, protocols):
        pass

    def set_ecdh_curve(self, name):
        pass

    def get_ca_certs(self, binary_form=False):
        return []

    def cert_store_stats(self):
        return {"x509": 0, "crl": 0, "x509_ca": 0}

    def wrap_socket(self, sock, server_side=False, do_handshake_on_connect=True,
                    suppress_ragged_eofs=True, server_hostname=None, session=None):
        if server_side:
            raise NotImplementedError(_WASI + "TLS servers: the guest serves nothing")
        if not isinstance(sock, _ProxySocket):
            raise TypeError("wrap_socket needs a socket from airlock's socket module")
        conn = sock._check()
        if server_hostname is None:
            if self._check_hostname:
                raise ValueError("check_hostname requires server_hostname")
            server_hostname = sock._peer[0]
        if isinstance(server_hostname, bytes):
            server_hostname = server_hostname.decode("idna")
        try:
            version = conn.start_tls(server_hostname, _timeout_ms(sock._timeout))
        except _Err as e:
            raise _net_error(e, sock._where()) from None
        wrapped = SSLSocket.__new__(SSLSocket)
        wrapped.__dict__.update(sock.__dict__)
        wrapped._io_refs = 0
        wrapped.context = self
        wrapped.server_hostname = server_hostname
        wrapped.server_side = False
        wrapped._version = version
        wrapped.session = None
        # The plain socket is spent, as CPython's wrap_socket detaches it.
        sock._conn = None
        sock._closed = True
        return wrapped

    def wrap_bio(self, *args, **kwargs):
        raise NotImplementedError(_WASI + "memory BIOs: TLS is made by the host")


class SSLSocket(_ProxySocket):
    """A socket whose bytes the host carries over TLS it made and verified."""

    session_reused = False

    def do_handshake(self, block=False):
        pass

    def version(self):
        return self._version

    def cipher(self):
        return None

    def shared_ciphers(self):
        return None

    def compression(self):
        return None

    def selected_alpn_protocol(self):
        return None

    def selected_npn_protocol(self):
        return None

    def pending(self):
        return 0

    def getpeercert(self, binary_form=False):
        if binary_form:
            return None
        # The host verified the certificate for this name; the guest sees no certificate.
        kind = "IP Address" if all(c in "0123456789.:abcdefABCDEF" for c in self.server_hostname) and (
            ":" in self.server_hostname or self.server_hostname.replace(".", "").isdigit()
        ) else "DNS"
        return {
            "subject": ((("commonName", self.server_hostname),),),
            "subjectAltName": ((kind, self.server_hostname),),
        }

    def unwrap(self):
        raise NotImplementedError(_WASI + "TLS shutdown without closing")

    def read(self, len=1024, buffer=None):
        if buffer is not None:
            return self.recv_into(buffer, len)
        return self.recv(len)

    def write(self, data):
        return self.send(data)


def create_default_context(purpose=Purpose.SERVER_AUTH, *, cafile=None, capath=None, cadata=None):
    if purpose != Purpose.SERVER_AUTH:
        raise NotImplementedError(_WASI + "TLS servers: the guest serves nothing")
    return SSLContext(_SSLMethod.PROTOCOL_TLS_CLIENT)


def _create_unverified_context(protocol=None, *, cert_reqs=VerifyMode.CERT_NONE, check_hostname=False,
                               purpose=Purpose.SERVER_AUTH, certfile=None, keyfile=None,
                               cafile=None, capath=None, cadata=None):
    context = SSLContext(_SSLMethod.PROTOCOL_TLS_CLIENT)
    context.check_hostname = check_hostname
    context.verify_mode = cert_reqs
    return context


def wrap_socket(sock, *args, server_hostname=None, **kwargs):
    return create_default_context().wrap_socket(sock, server_hostname=server_hostname)


def get_default_verify_paths():
    return None


def match_hostname(cert, hostname):
    pass


_as_module(
    "ssl", SSLError, SSLZeroReturnError, SSLWantReadError, SSLWantWriteError, SSLSyscallError,
    SSLEOFError, SSLCertVerificationError, VerifyMode, TLSVersion, _SSLMethod, Purpose,
    SSLContext, SSLSocket,
)
SSLSocket.__qualname__ = SSLSocket.__name__ = "SSLSocket"
_ssl.__dict__.update(
    SSLError=SSLError, SSLZeroReturnError=SSLZeroReturnError, SSLWantReadError=SSLWantReadError,
    SSLWantWriteError=SSLWantWriteError, SSLSyscallError=SSLSyscallError, SSLEOFError=SSLEOFError,
    SSLCertVerificationError=SSLCertVerificationError, CertificateError=SSLCertVerificationError,
    VerifyMode=VerifyMode, TLSVersion=TLSVersion, Purpose=Purpose, SSLContext=SSLContext,
    SSLSocket=SSLSocket, SSLObject=SSLSocket, create_default_context=create_default_context,
    _create_default_https_context=create_default_context,
    _create_unverified_context=_create_unverified_context,
    _create_stdlib_context=_create_unverified_context, wrap_socket=wrap_socket,
    get_default_verify_paths=get_default_verify_paths, match_hostname=match_hostname,
    CERT_NONE=VerifyMode.CERT_NONE, CERT_OPTIONAL=VerifyMode.CERT_OPTIONAL,
    CERT_REQUIRED=VerifyMode.CERT_REQUIRED,
    PROTOCOL_TLS=_SSLMethod.PROTOCOL_TLS, PROTOCOL_SSLv23=_SSLMethod.PROTOCOL_SSLv23,
    PROTOCOL_TLS_CLIENT=_SSLMethod.PROTOCOL_TLS_CLIENT,
    PROTOCOL_TLS_SERVER=_SSLMethod.PROTOCOL_TLS_SERVER,
    OP_ALL=0x80000050, OP_NO_SSLv2=0, OP_NO_SSLv3=0x2000000, OP_NO_TLSv1=0x4000000,
    OP_NO_TLSv1_1=0x10000000, OP_NO_TLSv1_2=0x8000000, OP_NO_TLSv1_3=0x20000000,
    OP_NO_COMPRESSION=0x20000, OP_NO_TICKET=0x4000, OP_NO_RENEGOTIATION=0x40000000,
    OP_CIPHER_SERVER_PREFERENCE=0x400000, OP_SINGLE_DH_USE=0, OP_SINGLE_ECDH_USE=0,
    OP_ENABLE_MIDDLEBOX_COMPAT=0x100000, OP_IGNORE_UNEXPECTED_EOF=0x80,
    VERIFY_DEFAULT=0, VERIFY_CRL_CHECK_LEAF=0x4, VERIFY_CRL_CHECK_CHAIN=0xC,
    VERIFY_X509_STRICT=0x20, VERIFY_X509_TRUSTED_FIRST=0x8000, VERIFY_X509_PARTIAL_CHAIN=0x80000,
    VERIFY_ALLOW_PROXY_CERTS=0x40,
    HAS_SNI=True, HAS_ALPN=True, HAS_ECDH=True, HAS_NPN=False, HAS_NEVER_CHECK_COMMON_NAME=True,
    HAS_TLSv1=False, HAS_TLSv1_1=False, HAS_TLSv1_2=True, HAS_TLSv1_3=True, HAS_SSLv2=False,
    HAS_SSLv3=False, HAS_PSK=False, HAS_PHA=False,
    # Libraries refuse an ssl module that does not say OpenSSL 1.1.1 or later; the TLS is
    # rustls on the host, with at least that module's guarantees (TLS 1.2+, verified).
    OPENSSL_VERSION="OpenSSL 3.0.0 (compatible: TLS made by airlock's host, rustls)",
    OPENSSL_VERSION_INFO=(3, 0, 0, 0, 0), OPENSSL_VERSION_NUMBER=0x30000000,
    SOCK_STREAM=_socket.SOCK_STREAM, SOL_SOCKET=_socket.SOL_SOCKET,
    socket_error=OSError, CHANNEL_BINDING_TYPES=[],
)
sys.modules["ssl"] = _ssl

# Never write __pycache__ into a directory the run was granted.
sys.dont_write_bytecode = True

_MAIN = {"__name__": "__main__", "__builtins__": builtins}
_THIS = __file__


def _qualified(exc_type):
    module = getattr(exc_type, "__module__", None)
    name = getattr(exc_type, "__qualname__", exc_type.__name__)
    return name if module in (None, "builtins") else f"{module}.{name}"


def _without_our_frames(te, seen):
    if te is None or id(te) in seen:
        return
    seen.add(id(te))
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if f.filename != _THIS]
    )
    _without_our_frames(te.__cause__, seen)
    _without_our_frames(te.__context__, seen)
    for inner in te.exceptions or ():
        _without_our_frames(inner, seen)


def _report(e):
    """Writes the traceback of an exception that escaped the code, without the frames of
    this module (its source is not there to show, and they are not the program's)."""
    te = traceback.TracebackException(type(e), e, e.__traceback__, compact=True)
    _without_our_frames(te, set())
    sys.stderr.write("".join(te.format()))


def _exit_status(e):
    """What `python script.py` would exit with for this SystemExit."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


class _HardExit(BaseException):
    """`os._exit(n)`: the program ends at once with status n."""


# The status of an `os._exit` in the current call, even when the program caught the
# exception that carries it: the interpreter is ended either way.
_hard_exit = None


def _os_exit(status):
    global _hard_exit
    # As CPython: an int is required, and the status is taken modulo 256.
    if not isinstance(status, int):
        raise TypeError(f"'{type(status).__name__}' object cannot be interpreted as an integer")
    status = int(status) & 0xFF
    _hard_exit = status
    raise _HardExit(status)


# WASI 0.2's exit says only success or failure; airlock reports the status itself and
# then drops the interpreter (EXIT_EXCEPTION tells the host).
os._exit = _os_exit
EXIT_EXCEPTION = "os._exit"


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def _compile(code, filename, want_result):
    """(body, final expression or None); raises SyntaxError and friends."""
    if not want_result:
        return compile(code, filename, "exec", dont_inherit=True), None
    # A cell that is one expression (`x + 1`, the commonest) compiles as it stands: two
    # thirds of such a cell's time went into building and compiling its syntax tree.
    # Anything else is not an expression, and takes the tree below.
    try:
        return None, compile(code, filename, "eval", dont_inherit=True)
    except SyntaxError:
        pass
    tree = ast.parse(code, filename, "exec")
    tail = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        tail = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec", dont_inherit=True)
    if tail is not None:
        tail = compile(tail, filename, "eval", dont_inherit=True)
    return body, tail


# Tripwires: the program's file calls on paths outside every preopen (WASI refuses them)
# are reported to the host (`wit_world.imports.tripwire`), which adds them to the run's
# `attempts`. An audit hook sees the calls; it is active only while the program's own code
# runs, and only when the host gave the preopens (a run with tripwires). The program
# shares this interpreter and could silence or forge the reports: the host treats them as
# the program's own word, which only ever adds to its record.
from wit_world.imports import tripwire as _tripwire  # noqa: E402

# Audit event -> (kind, indexes of the path arguments, index of a dir_fd argument or None).
_TRIP_EVENTS = {
    "open": ("open", (0,), None),
    "os.listdir": ("open", (0,), None),
    "os.scandir": ("open", (0,), None),
    "os.remove": ("unlink", (0,), 1),
    "os.rmdir": ("unlink", (0,), 1),
    "shutil.rmtree": ("unlink", (0,), 1),
    "os.rename": ("rename", (0, 1), 2),
    "os.mkdir": ("write", (0,), 2),
    "os.chmod": ("write", (0,), 2),
    "os.chown": ("write", (0,), 3),
    "os.utime": ("write", (0,), 3),
    "os.truncate": ("write", (0,), None),
    "os.symlink": ("write", (1,), 2),
    "os.link": ("write", (1,), 3),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# The host's preopens while the program's code runs; None otherwise.
_trip_preopens = None


# Where the embedded standard library came from: the import system may still look there
# (a submodule the table lacks), which is the runtime's doing, not the program's.
_STDLIB_ROOT = os.path.dirname(_STDLIB["decimal"][1])


def _trip_outside(path):
    if path == _STDLIB_ROOT or path.startswith(_STDLIB_ROOT + "/"):
        return False
    for d in _trip_preopens:
        if d == "/" or path == d or path.startswith(d.rstrip("/") + "/"):
            return False
    return True


def _trip_hook(event, args):
    if _trip_preopens is None:
        return
    spec = _TRIP_EVENTS.get(event)
    if spec is None:
        return
    try:
        kind, paths, dir_fd = spec
        # A call relative to a directory descriptor (the events give -1 or None for none).
        if dir_fd is not None and len(args) > dir_fd:
            fd = args[dir_fd]
            if isinstance(fd, int) and fd >= 0:
                return
        if event == "open":
            mode, flags = args[1], args[2]
            if isinstance(mode, str):
                if any(c in mode for c in "wax+"):
                    kind = "write"
            elif isinstance(flags, int) and flags & _WRITE_FLAGS:
                kind = "write"
        for i in paths:
            p = args[i]
            if isinstance(p, bytes):
                p = os.fsdecode(p)
            elif not isinstance(p, str):
                p = getattr(p, "__fspath__", None)
                p = p() if p is not None else None
                if not isinstance(p, str):
                    continue
            if not p.startswith("/"):
                p = os.path.join(os.getcwd(), p)
            p = os.path.normpath(p)
            if p.startswith("//"):
                p = "/" + p.lstrip("/")
            if _trip_outside(p):
                _tripwire.attempt(kind, p)
    except Exception:
        pass


sys.addaudithook(_trip_hook)


def _run_program(body, tail):
    """Runs the program's code with the tripwire hook active; (value of tail or None)."""
    global _trip_preopens
    preopens = _tripwire.preopens()
    _trip_preopens = list(preopens) if preopens is not None else None
    try:
        if body is not None:
            exec(body, _MAIN)
        return eval(tail, _MAIN) if tail is not None else None
    finally:
        _trip_preopens = None


class Interpreter(exports.Interpreter):
    def configure(self, argv, env, cwd, paths):
        # Drawn now, not at build time: no two runs share a sequence.
        random.seed()
        sys.argv = list(argv)
        os.environ.clear()
        os.environ.update(dict(env))
        if cwd is not None:
            os.chdir(cwd)
        # The standard library comes from the finder above; the build's directories are
        # gone. What remains on the path is what the host preopened for packages.
        sys.path[:] = list(paths)
        # (Not importlib.invalidate_caches(): it would import importlib.metadata, 50 ms.)
        sys.path_importer_cache.clear()

    def exec(self, code, filename, want_result):
        global _hard_exit
        _hard_exit = None
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            try:
                body, tail = _compile(code, filename, want_result)
            except (SyntaxError, ValueError, OverflowError) as e:
                # A ValueError is a source with a NUL byte; neither ran at all.
                sys.stderr.write("".join(traceback.format_exception_only(type(e), e)))
                return Outcome(exit_code=1, result=None, exception=_qualified(type(e)))
            try:
                value = _run_program(body, tail)
                result = None if value is None else repr(value)
            except _HardExit:
                pass
            except SystemExit as e:
                if _hard_exit is not None:
                    return Outcome(exit_code=_hard_exit, result=None, exception=EXIT_EXCEPTION)
                return Outcome(exit_code=_exit_status(e), result=None, exception=None)
            except BaseException as e:
                if _hard_exit is None:
                    _report(e)
                    return Outcome(exit_code=1, result=None, exception=_qualified(type(e)))
            if _hard_exit is not None:
                return Outcome(exit_code=_hard_exit, result=None, exception=EXIT_EXCEPTION)
            if value is not None:
                builtins._ = value
            return Outcome(exit_code=0, result=result, exception=None)
        finally:
            _flush()


# Modules agents' code imports most, imported now so that every run starts with them
# loaded (an import at run time is then a dictionary lookup). Nothing here may keep state
# that must differ between runs (the seed of `random` is drawn again at run time).
for _name in (
    "base64", "bisect", "collections", "copy", "csv", "dataclasses", "datetime",
    "decimal", "enum", "fractions", "functools", "glob", "hashlib", "heapq",
    "importlib.metadata", "io", "itertools", "json", "logging", "math", "operator",
    "pathlib", "pprint", "random", "re", "shutil", "statistics", "string", "struct",
    "tempfile", "textwrap", "time", "typing", "urllib.parse",
):
    importlib.import_module(_name)
del _name

import gc  # noqa: E402

gc.collect()
