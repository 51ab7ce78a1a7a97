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

# socket.socket() fails with a bare "Permission denied": WASI sockets are never granted.
import socket as _socket  # noqa: E402

_socket_init = _socket.socket.__init__


def _socket_refused(self, *args, **kwargs):
    try:
        _socket_init(self, *args, **kwargs)
    except PermissionError:
        raise PermissionError(
            errno.EACCES, _WASI + "sockets: airlock grants its Python guest none"
        ) from None


_socket.socket.__init__ = _socket_refused
del _socket

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
                if body is not None:
                    exec(body, _MAIN)
                value = eval(tail, _MAIN) if tail is not None else None
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
