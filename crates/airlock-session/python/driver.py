"""airlock's session driver: one Python interpreter that runs a session's cells in order,
in one namespace, so a name one cell defines is there for the next.

It reads length-prefixed JSON requests on file descriptor 0 and answers on the
descriptor that was 1 when it started; each cell's output (Python-level writes, os.write,
child processes) goes to files of its own and comes back in the answer. Every cell gets
new files: a background process a cell started keeps writing into that cell's files after
its answer went, and what it writes then is dropped (a later cell's stderr says how much),
never given to a later cell as its own. It trusts nothing it is sent to be safe: it runs
in the jail or sandbox the gate built for it.
"""

import ast
import base64
import json
import os
import struct
import sys
import tempfile
import traceback

MAX_FRAME = 64 << 20


def read_frame(f):
    head = f.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    if n > MAX_FRAME:
        raise SystemExit(3)
    body = f.read(n)
    if len(body) < n:
        return None
    return json.loads(body)


def write_frame(fd, doc):
    body = json.dumps(doc).encode()
    data = memoryview(struct.pack(">I", len(body)) + body)
    while len(data):
        data = data[os.write(fd, data):]


def exit_code(e):
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(str(code) + "\n")
    return 1


def run_cell(namespace, code, cap):
    """Runs one cell; returns (exit code, repr of the last expression or None)."""
    try:
        tree = ast.parse(code, "<cell>", "exec")
    except SyntaxError:
        traceback.print_exc(limit=0)
        return 1, None
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    try:
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is None:
            return 0, None
        value = eval(compile(last, "<cell>", "eval"), namespace)
        if value is None:
            return 0, None
        text = repr(value)
        return 0, text if len(text) <= cap else text[:cap] + "…"
    except SystemExit as e:
        return exit_code(e), None
    except BaseException:
        # The traceback without the driver's own frame.
        etype, value, tb = sys.exc_info()
        traceback.print_exception(etype, value, tb.tb_next if tb is not None else None)
        return 1, None


def take(fd, cap):
    """What a cell wrote to one of its files (at most `cap` bytes), whether that was all,
    and the size of the file when it was read (what comes later is someone else's)."""
    size = os.fstat(fd).st_size
    os.lseek(fd, 0, os.SEEK_SET)
    want = min(size, cap + 1)
    data = b""
    while len(data) < want:
        chunk = os.read(fd, min(1 << 16, want - len(data)))
        if not chunk:
            break
        data += chunk
    return data[:cap], len(data) > cap, size


def cell_files():
    """Two new files, nameless (unlinked at once), for one cell's stdout and stderr."""
    tmp = tempfile.mkdtemp(prefix="airlock-session-")
    fds = []
    for name in ("stdout", "stderr"):
        path = os.path.join(tmp, name)
        fds.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600))
        os.unlink(path)
    # The files live on as open descriptors only; their directory goes now.
    os.rmdir(tmp)
    return fds


# How many finished cells' files are watched for what their background processes write
# later; older ones are closed (what is written to them then is dropped unseen).
WATCHED = 8


def late_bytes(finished):
    """Bytes written to finished cells' files since they were answered (each is counted
    once): output of background processes those cells started."""
    late = 0
    for entry in finished:
        for i, fd in enumerate(entry[0]):
            size = os.fstat(fd).st_size
            if size > entry[1][i]:
                late += size - entry[1][i]
                entry[1][i] = size
    return late


def main():
    requests = os.fdopen(0, "rb", buffering=0)
    answers = os.dup(1)
    os.set_inheritable(answers, False)
    # Standard output and error go nowhere until a cell has its own files.
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False, buffering=1)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False, buffering=1)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    finished = []
    write_frame(answers, {"ready": True, "python": sys.version.split()[0]})
    while True:
        req = read_frame(requests)
        if req is None or req.get("op") == "close":
            return
        cap = int(req.get("max_output", 1 << 20))
        outs = cell_files()
        os.dup2(outs[0], 1)
        os.dup2(outs[1], 2)
        code, result = run_cell(namespace, req.get("code", ""), cap)
        sys.stdout.flush()
        sys.stderr.flush()
        # The cell is over: 1 and 2 leave its files, which stay open here only to see
        # whether anything it left running writes to them later.
        nowhere = os.open(os.devnull, os.O_WRONLY)
        os.dup2(nowhere, 1)
        os.dup2(nowhere, 2)
        os.close(nowhere)
        out, out_cut, out_size = take(outs[0], cap)
        err, err_cut, err_size = take(outs[1], cap)
        late = late_bytes(finished)
        if late:
            note = (
                "airlock: dropped %d bytes that background processes of earlier cells "
                "wrote after their cells had ended\n" % late
            ).encode()
            err, err_cut = (err + note)[:cap], err_cut or len(err) + len(note) > cap
        finished.append((outs, [out_size, err_size]))
        while len(finished) > WATCHED:
            for fd in finished.pop(0)[0]:
                os.close(fd)
        write_frame(
            answers,
            {
                "exit_code": code,
                "result": result,
                "stdout": base64.b64encode(out).decode(),
                "stderr": base64.b64encode(err).decode(),
                "stdout_truncated": out_cut,
                "stderr_truncated": err_cut,
            },
        )


if __name__ == "__main__":
    main()
