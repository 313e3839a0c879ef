# SPDX-License-Identifier: MIT
"""Every exception class is raised where it should be, with the library's
errno and, for refused connections, the daemon's reason; tensors that do
not fit are refused before any copy."""
from __future__ import annotations

import errno
import os
import socket
import threading

import numpy as np
import pytest

import kvclient
from kvclient._ccall import _error
from conftest import tiny_model, tokens, wait_for

torch = pytest.importorskip("torch")


def test_no_daemon(tmp_path):
    with pytest.raises(kvclient.NoDaemonError) as e:
        kvclient.Client(tiny_model(), socket=str(tmp_path / "none.sock"))
    assert e.value.errno == errno.ENOENT and "is it running" in str(e.value)
    assert isinstance(e.value, ConnectionError)
    # Said once: the library's reason, not the errno's text before it too,
    # and the path once (issue #24).
    msg = str(e.value.strerror)
    assert msg.count("no kvcached socket") == 1, msg
    assert msg.count(str(tmp_path / "none.sock")) == 1, msg
    # A socket file nobody listens on.
    path = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()
    with pytest.raises(kvclient.NoDaemonError) as e:
        kvclient.Client(tiny_model(), socket=path)
    assert e.value.errno == errno.ECONNREFUSED


def test_wrong_geometry_names_the_numbers(daemon):
    m = kvclient.Model("kvt-tiny", "float16", 1, 2, 32, block_tokens=32)
    with pytest.raises(kvclient.GeometryError) as e:
        kvclient.Client(m, socket=daemon.sock)
    assert e.value.errno == errno.EMEDIUMTYPE and isinstance(e.value, ValueError)
    assert "32-token blocks" in e.value.reason and "16-token blocks" in e.value.reason
    big = kvclient.Model("kvt-big", "float16", 2, 2, 64, 16)	# 16 KiB pages
    with pytest.raises(kvclient.GeometryError) as e:
        kvclient.Client(big, socket=daemon.sock)
    assert "16384" in e.value.reason and "4096" in e.value.reason, e.value.reason


def test_not_trusted(daemon_factory):
    d = daemon_factory("--allow-users", "65534", "--socket-mode", "0666")
    with pytest.raises(kvclient.NotTrustedError) as e:
        kvclient.Client(tiny_model(), socket=d.sock)
    assert e.value.errno == errno.EACCES and isinstance(e.value, PermissionError)
    assert "does not trust uid" in e.value.reason


def _serve_as(path: str, uid: int, ready) -> None:
    """A forked server that listens as `uid` (SO_PEERCRED reports the
    credentials of listen()), accepts one connection and hangs up."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    os.chmod(path, 0o666)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            srv.listen(4)
            ready.set()
            for _ in range(2):
                conn, _ = srv.accept()
                conn.recv(4096)
                conn.close()
        finally:
            os._exit(0)
    srv.close()
    return pid


def test_untrusted_daemon(tmp_path, monkeypatch):
    """A socket served by another user is refused before anything is sent,
    unless $KVCACHED_DAEMON_USER names that user."""
    if os.geteuid() != 0:
        pytest.skip("needs root to serve a socket as another user")
    import multiprocessing
    os.chmod(tmp_path, 0o755)
    path = str(tmp_path / "other.sock")
    ready = multiprocessing.get_context("fork").Event()
    pid = _serve_as(path, 65534, ready)
    try:
        assert ready.wait(30)
        with pytest.raises(kvclient.UntrustedDaemonError) as e:
            kvclient.Client(tiny_model(), socket=path)
        assert e.value.errno == errno.EKEYREJECTED and isinstance(e.value, ConnectionError)
        assert "uid 65534" in e.value.reason and "KVCACHED_DAEMON_USER" in e.value.reason
        monkeypatch.setenv("KVCACHED_DAEMON_USER", "65534")
        # Trusted now: the HELLO goes out, and the server just hangs up.
        with pytest.raises(kvclient.ConnectionLostError):
            kvclient.Client(tiny_model(), socket=path)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_quota(daemon_factory):
    """A process holding its share of the pool gets its ALLOC cut, then
    refused."""
    d = daemon_factory("--max-share", "10")	# 25 of 256 pages
    with kvclient.Client(tiny_model(), socket=d.sock) as c:
        with c.request(tokens(64 * 16, 11)) as r:
            r.lookup()
            got = r.alloc()
            assert 0 < got < 64
            with c.request(tokens(8 * 16, 12)) as r2:
                r2.lookup()
                with pytest.raises(kvclient.QuotaError) as e:
                    r2.alloc()
                assert e.value.errno == errno.EDQUOT and "max-share" in str(e.value)


def _open_when_free(sock):
    """Open once the daemon has seen the fixture's probe connection go (it
    held the only client slot until then)."""
    def attempt():
        try:
            return kvclient.Client(tiny_model(), socket=sock)
        except kvclient.TooManyClientsError:
            return None
    return wait_for(attempt, "the probe connection's slot freed")


def test_too_many_clients_and_models(daemon_factory):
    d = daemon_factory("--max-clients", "1")
    with _open_when_free(d.sock):
        with pytest.raises(kvclient.TooManyClientsError) as e:
            kvclient.Client(tiny_model(), socket=d.sock)
        assert e.value.errno == errno.EUSERS
    d = daemon_factory("--max-clients", "80", "--max-per-process", "80")
    held = [kvclient.Client(tiny_model(f"model-{i}"), socket=d.sock) for i in range(64)]
    try:
        with pytest.raises(kvclient.TooManyModelsError) as e:
            kvclient.Client(tiny_model("model-64"), socket=d.sock)
        assert e.value.errno == errno.ETOOMANYREFS
    finally:
        for c in held:
            c.close()


def test_protocol_error(tmp_path):
    """A socket that answers with bytes that are not kvcached's protocol."""
    path = str(tmp_path / "fake.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"\0" * 64)
        conn.close()
    th = threading.Thread(target=serve)
    th.start()
    try:
        with pytest.raises(kvclient.ProtocolError) as e:
            kvclient.Client(tiny_model(), socket=path)
        assert e.value.errno in (errno.EPROTO, errno.EBADMSG)
    finally:
        th.join()
        srv.close()


def test_connection_lost(daemon_factory):
    d = daemon_factory()
    c = kvclient.Client(tiny_model(), socket=d.sock)
    r = c.request(tokens(2 * 16, 1))
    r.lookup()
    d.proc.kill()
    d.proc.wait()
    with pytest.raises(kvclient.ConnectionLostError) as e:
        r.alloc()
    assert e.value.errno == errno.ENOTCONN and isinstance(e.value, ConnectionError)
    with pytest.raises(kvclient.ConnectionLostError):
        c.request(tokens(16, 2)).lookup()	# the handle is dead now
    r.release()
    c.close()


def test_invalid_and_too_big_arguments(daemon):
    with pytest.raises(kvclient.InvalidArgumentError) as e:
        kvclient.Client(tiny_model(), socket="/tmp/" + "x" * 200)
    assert e.value.errno == errno.ENAMETOOLONG
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        with pytest.raises(kvclient.TooBigError):
            c.request([1] * 16, label="x" * 24)
        with pytest.raises(kvclient.TooBigError):
            c.request([1] * 16, extra=b"e" * 4097)
        with pytest.raises(kvclient.TooBigError):
            c.keys([1] * 16, extra=b"e" * 4097)
        with c.request([1] * 16) as r:
            r.lookup()
            with pytest.raises(kvclient.InvalidArgumentError, match="speed must be > 0"):
                r.restore_pays(0)
        for bad in ([-1, 2], [2**32], np.array([1.5]), np.array([[1, 2]]),
                    np.array([-3], dtype=np.int64), torch.tensor([[1]]),
                    torch.tensor([1.0]), torch.tensor([-1])):
            with pytest.raises(kvclient.TensorError):
                c.request(bad)
        for bad in (b"\x01\x02", "tokens", [1, "a"]):
            with pytest.raises(TypeError):
                c.request(bad)
        with pytest.raises(TypeError):
            kvclient.Client(tiny_model(), socket=daemon.sock, salt=5)


def test_label_too_long_names_the_label(daemon):
    """A label over KVC_MAX_LABEL (23 bytes) is a TooBigError that names the
    label and its limit, not the prompt or extra keys (issue #24)."""
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        with c.request([1] * 16, label="x" * 23) as r:	# the longest there is
            assert r.lookup() == 0
        with pytest.raises(kvclient.TooBigError) as e:
            c.request([1] * 16, label="y" * 40)
        assert e.value.errno == errno.E2BIG
        msg = str(e.value)
        assert "label" in msg and "40 bytes" in msg and "23" in msg, msg
        assert "prompt" not in msg and "extra" not in msg, msg
        with pytest.raises(kvclient.TooBigError, match="label 'é{12}': 24 bytes"):
            c.request([1] * 16, label="é" * 12)	# 12 characters, 24 bytes
        with pytest.raises(kvclient.InvalidArgumentError, match="NUL"):
            c.request([1] * 16, label="a\0b")
        with pytest.raises(TypeError, match="label must be a str"):
            c.request([1] * 16, label=b"bytes")
        # The prompt's and the extra keys' limits are named as such.
        with pytest.raises(kvclient.TooBigError, match="extra keys are too long: 4097 bytes"):
            c.request([1] * 16, extra=b"e" * 4097)
        assert not c._live	# nothing was left behind by the refusals


def test_request_order(daemon):
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        t = tokens(2 * 16, 3)
        kv = kvclient.PagedKV(c, [np.zeros((2, 4, 16, 2, 32), np.float16)])
        with c.request(t) as r:
            with pytest.raises(kvclient.RequestStateError, match="after alloc"):
                r.publish()
            # alloc, gather and scatter before lookup (issue #24: alloc was
            # accepted and asked the daemon for pages).
            with pytest.raises(kvclient.RequestStateError, match="after lookup"):
                r.alloc()
            with pytest.raises(kvclient.RequestStateError, match="after lookup"):
                r.gather(kv, [0])
            with pytest.raises(kvclient.RequestStateError, match="after alloc"):
                r.scatter(kv, [0])
            assert r.granted == 0 and c.stats()["client"]["pages_writing"] == 0
            r.lookup()
            with pytest.raises(kvclient.RequestStateError, match="once, first"):
                r.lookup()
            with pytest.raises(kvclient.RequestStateError, match="after alloc"):
                r.scatter(kv, [0])	# looked up, nothing granted yet
            assert r.alloc() == 2
            with pytest.raises(kvclient.RequestStateError):
                r.alloc()
            with pytest.raises(kvclient.RequestStateError, match="before alloc"):
                r.restore()
            r.scatter(kv, [0, 1])
            assert r.publish() == 2
            with pytest.raises(kvclient.RequestStateError, match="before publish"):
                r.scatter(kv, [0])	# published pages are everyone's
            r.gather(kv, [0, 1])	# and readable
            with pytest.raises(kvclient.RequestStateError, match="once, after alloc"):
                r.publish()	# double publish
        with c.request(t) as r:
            r.lookup()
            assert r.alloc() == 0
            with pytest.raises(kvclient.RequestStateError, match="nothing to publish"):
                r.publish()
        e = kvclient.RequestStateError
        assert issubclass(e, kvclient.InvalidArgumentError) and issubclass(e, ValueError)


def test_request_used_after_release(daemon):
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        kv = kvclient.PagedKV(c, [np.zeros((2, 4, 16, 2, 32), np.float16)])
        with c.request(tokens(2 * 16, 4)) as r:
            pass
        r.release()	# harmless twice
        for call in (r.lookup, r.alloc, r.publish, r.restore, r.keys, lambda: r.page(0),
                     lambda: r.page_array(0), lambda: r.spilled, lambda: r.blocks,
                     lambda: r.gather(kv, [0]), lambda: r.scatter(kv, [0]),
                     lambda: r.restore_pays(1.0), lambda: r.page_index(0)):
            with pytest.raises(kvclient.RequestReleasedError, match="released"):
                call()
    with pytest.raises(kvclient.ClientClosedError) as e:
        c.request([1] * 16)
    assert e.value.errno == errno.EBADF
    with pytest.raises(kvclient.ClientClosedError):
        c.stats()
    c.close()	# harmless twice


def test_pages_that_are_not_there(daemon):
    with kvclient.Client(tiny_model(), socket=daemon.sock) as c:
        t = tokens(3 * 16, 5)
        kv = kvclient.PagedKV(c, [np.zeros((2, 4, 16, 2, 32), np.float16)])
        with c.request(t[:16]) as r:
            r.lookup()
            r.alloc()
            r.publish()
        with c.request(t) as r:
            assert r.lookup() == 1
            with pytest.raises(kvclient.NoPageError) as e:
                r.page(1)
            assert e.value.errno == errno.ENOENT and isinstance(e.value, LookupError)
            with pytest.raises(IndexError):
                r.page(3)
            with pytest.raises(kvclient.NoPageError):
                r.gather(kv, [0, 1])	# block 1 missed
            with pytest.raises(kvclient.NoPageError):
                r.page_index(2)
            assert r.alloc() == 2
            with pytest.raises(kvclient.ReadOnlyBlockError) as e:
                r.scatter(kv, [0], first=0)	# block 0 is a hit: shared
            assert e.value.errno == errno.EPERM


def test_tensors_refused_before_any_copy(daemon):
    """Wrong shape, dtype, strides, layer count or device: refused when the
    PagedKV is made; bad ids or runs: refused by the call, and the engine's
    cache is left as it was."""
    m = tiny_model()
    good = (2, 4, 16, 2, 32)
    with kvclient.Client(m, socket=daemon.sock) as c:
        cases = [
            ([np.zeros((2, 4, 16, 2, 16), np.float16)], kvclient.TensorError, "shape"),
            ([np.zeros((4, 16, 2, 32), np.float16)], kvclient.TensorError, "shape"),
            ([np.zeros(good, np.float32)], kvclient.TensorError, "dtype float32"),
            ([np.zeros(good, np.uint16)], kvclient.TensorError, "dtype uint16"),
            ([np.zeros(good, np.float16)] * 2, kvclient.TensorError, "one per layer"),
            ([np.zeros((2, 4, 2, 16, 32), np.float16).transpose(0, 1, 3, 2, 4)],
             kvclient.TensorError, "dense"),
            ([np.zeros((4, 2, 16, 2, 32), np.float16).transpose(1, 0, 2, 3, 4)],
             kvclient.TensorError, "V must start right after K"),
            ([torch.zeros(good, dtype=torch.bfloat16)], kvclient.TensorError, "bfloat16"),
            ([torch.zeros(good, dtype=torch.float16, device="meta")],
             kvclient.TensorDeviceError, "on meta"),
            (["not a tensor"], TypeError, "torch.Tensor or numpy.ndarray"),
        ]
        ro = np.zeros(good, np.float16)
        ro.flags.writeable = False
        cases.append(([ro], kvclient.TensorError, "read-only"))
        for k, exc, msg in cases:
            with pytest.raises(exc, match=msg):
                kvclient.PagedKV(c, k)
        with pytest.raises(ValueError, match="needs v"):
            kvclient.PagedKV(c, [np.zeros((4, 16, 2, 32), np.float16)], layout="kv")
        kvs = [np.zeros((4, 16, 2, 32), np.float16)]
        with pytest.raises(kvclient.TensorError, match="blocks"):
            kvclient.PagedKV(c, kvs, [np.zeros((5, 16, 2, 32), np.float16)])
        assert isinstance(kvclient.TensorDeviceError(22, "x"), ValueError)

        cache = np.full(good, 7, np.float16)
        kv = kvclient.PagedKV(c, [cache])
        t = tokens(2 * 16, 6)
        with c.request(t) as r:
            r.lookup()
            r.alloc()
            r.page_array(0)[...] = 1
            r.page_array(1)[...] = 2
            r.publish()
        with c.request(t) as r:
            assert r.lookup() == 2
            for ids, first, msg in [([0, 4], 0, r"engine block id outside 0\.\.3"),
                                    ([-1], 0, "outside"),
                                    ([0, 1], 1, "outside the request's 2 blocks"),
                                    ([0], -1, "outside the request")]:
                with pytest.raises(kvclient.InvalidArgumentError, match=msg):
                    r.gather(kv, ids, first=first)
            for ids in (np.array([[0, 1]]), np.array([0.5]), torch.zeros(1, device="meta")):
                with pytest.raises(kvclient.TensorError):
                    r.gather(kv, ids)
            with pytest.raises(TypeError, match="stream"):
                r.gather(kv, [0], stream="default")
            assert (cache == 7).all(), "a refused gather copied something"
            r.gather(kv, [3, 2], stream=0)	# the stream is ignored on a host pool
            assert (cache[:, 3] == 1).all() and (cache[:, 2] == 2).all()
            assert (cache[:, :2] == 7).all()
        # A PagedKV checked against another model's Client.
        other = kvclient.Client(tiny_model("kvt-other", dtype="bf16"), socket=daemon.sock)
        with other, c.request(t) as r:
            r.lookup()
            with pytest.raises(kvclient.TensorError, match="another model"):
                r.gather(kvclient.PagedKV(other, [np.zeros(good, np.uint16)]), [0])


@pytest.mark.parametrize("err,cls,base", [
    (errno.ENOSPC, kvclient.NoSpaceError, None),
    (errno.EEXIST, kvclient.KeyCollisionError, None),
    (errno.ENOTSUP, kvclient.NotSupportedError, None),
    (errno.ENODEV, kvclient.NoDeviceError, None),
    (errno.EFAULT, kvclient.DeviceMemoryError, kvclient.TensorDeviceError),
    (errno.EXDEV, kvclient.WrongDeviceError, kvclient.TensorDeviceError),
    (errno.ENOMEM, kvclient.OutOfMemoryError, MemoryError),
    (errno.ECHILD, kvclient.ForkedHandleError, None),
    (errno.EIO, kvclient.KvcError, OSError),
])
def test_errno_classes(err, cls, base):
    """The errnos no test here can provoke (no GPU, no full pool of pins)
    map to their classes with the library's text."""
    e = _error(-err, "kvc_gather")
    assert type(e) is cls and e.errno == err
    assert isinstance(e, kvclient.KvcError) and isinstance(e, OSError)
    if base:
        assert isinstance(e, base)
    text = kvclient._lib.lib().strerror(-err).decode()
    assert (text in str(e)) or err == errno.ECHILD
    assert "kvc_gather" in str(e)
    if err == errno.ECHILD:
        assert "open a new kvclient.Client in this process" in str(e)


def test_cuda_pool_paths_without_a_gpu(daemon):
    """What a cuda pool changes on the Python side, checked where it can be
    without a GPU: a Client that sees its pool as GPU memory refuses host
    tensors before any copy, refuses page views, and resolves streams; the
    launch itself is `make test-gpu`'s."""
    from types import SimpleNamespace
    c = kvclient.Client(tiny_model(), socket=daemon.sock)
    try:
        good = (2, 4, 16, 2, 32)
        kv = kvclient.PagedKV(c, [torch.zeros(good, dtype=torch.float16)])
        # Host pool: any stream is accepted and ignored.
        assert c._stream(7, kv) is None and c._stream(None, kv) is None
        c.pool_kind, c.pool_device = "cuda", 0
        for t in ([torch.zeros(good, dtype=torch.float16)], [np.zeros(good, np.float16)]):
            with pytest.raises(kvclient.DeviceMemoryError, match="the pool is on cuda:0") as e:
                kvclient.PagedKV(c, t)
            assert e.value.errno == errno.EFAULT
        with pytest.raises(kvclient.TensorDeviceError):
            kvclient.PagedKV(c, [torch.zeros(good, dtype=torch.float16, device="meta")])
        kv.device = 0	# as a PagedKV of the cuda pool's tensors: copies on its GPU
        assert c._stream(12345, kv) == 12345
        assert c._stream(SimpleNamespace(cuda_stream=77), kv) == 77
        with pytest.raises(TypeError, match="stream"):
            c._stream(SimpleNamespace(ptr=1), kv)
        with c.request(tokens(16, 9)) as r:
            r.lookup()
            r.alloc()
            with pytest.raises(kvclient.NotSupportedError, match="GPU memory"):
                r.page(0)
    finally:
        c.pool_kind, c.pool_device = "host", None
        c.close()
