# SPDX-License-Identifier: MIT
"""KV events for cluster routers, end to end (docs/EVENTS.md).

A real kvcached is started on a private socket with --kv-events on ipc://
endpoints, real clients (tests/helpers/kvev.c, on libkvclient) publish,
and subscribers written with Debian's python3-zmq decode every batch the
way vLLM's msgspec decoder would for the schema kvcached follows: strict
tags, field order and count, and types (decode_batch below).

What it shows: a BlockStored for every published block (hashes chained,
the prompt's token ids); the three hash forms; a BlockRemoved for every
eviction; a removal plus a store with medium DISK for every spilled block
and the reverse for a restore; AllBlocksCleared when a namespace's blocks
are dropped; a late subscriber that replays from sequence 0 rebuilding
the same set of blocks; a flood with a subscriber that never reads, where
the clients never stall and the dropped batches are counted (and the
sequence gap shows, and replay fills it); and that the daemon maps no
libzmq, nor any msgpack library, without --kv-events.
"""
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time

import msgpack
import pytest
import zmq

BUILD = os.environ.get("BUILD", "build")
KVCACHED = os.path.join(BUILD, "kvcached")
KVEV = os.path.join(BUILD, "tests", "helpers", "kvev")
KVSTAT = os.path.join(BUILD, "kvstat")
BT = 16
END = (1 << 64) - 1

pytestmark = pytest.mark.skipif(
    not (os.access(KVCACHED, os.X_OK) and os.access(KVEV, os.X_OK)),
    reason="kvcached or tests/helpers/kvev not built (make all)")


# ------------------------------------------------------------ the schema

class SchemaError(Exception):
    pass


def _int(x):
    """msgspec's int: a msgpack int (bool is not one), int64 or uint64."""
    return type(x) is int and -(1 << 63) <= x < (1 << 64)


def _hash(x):
    # ExternalBlockHash = bytes | int
    if not (_int(x) or type(x) is bytes):
        raise SchemaError("block hash %r is neither int nor bytes" % (x,))
    return x


def _opt(x, kind, what):
    if x is not None and not kind(x):
        raise SchemaError("%s %r is not %s or None" % (what, x, kind.__name__))
    return x


def _str(x):
    return type(x) is str


def decode_batch(payload):
    """Decode one payload as msgspec decodes vLLM's KVEventBatch with
    array_like=True, tag=True structs (the vLLM 0.14 schema): returns
    {"ts", "data_parallel_rank", "events": [dict, ...]}."""
    try:
        obj = msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=True)
    except msgpack.ExtraData as e:
        raise SchemaError("trailing bytes after the batch") from e
    if type(obj) is not list or not 2 <= len(obj) <= 3:
        raise SchemaError("batch is not an array of 2 or 3 fields: %r" % (obj,))
    ts, events = obj[0], obj[1]
    rank = obj[2] if len(obj) == 3 else None
    if type(ts) is not float:
        raise SchemaError("ts %r is not a float" % (ts,))
    if type(events) is not list:
        raise SchemaError("events is not an array")
    _opt(rank, _int, "data_parallel_rank")
    out = []
    for ev in events:
        if type(ev) is not list or not ev or type(ev[0]) is not str:
            raise SchemaError("event %r is not a tagged array" % (ev,))
        tag = ev[0]
        if tag == "BlockStored":
            if len(ev) != 8:
                raise SchemaError("BlockStored with %d fields" % (len(ev) - 1))
            _, hashes, parent, tokens, size, lora_id, medium, lora_name = ev
            if type(hashes) is not list or type(tokens) is not list:
                raise SchemaError("block_hashes or token_ids is not an array")
            d = {"type": tag, "block_hashes": [_hash(h) for h in hashes],
                 "parent_block_hash": None if parent is None else _hash(parent),
                 "token_ids": tokens, "block_size": size,
                 "lora_id": _opt(lora_id, _int, "lora_id"),
                 "medium": _opt(medium, _str, "medium"),
                 "lora_name": _opt(lora_name, _str, "lora_name")}
            if not all(_int(t) for t in tokens) or not _int(size):
                raise SchemaError("token_ids or block_size is not int")
        elif tag == "BlockRemoved":
            if len(ev) != 3:
                raise SchemaError("BlockRemoved with %d fields" % (len(ev) - 1))
            if type(ev[1]) is not list:
                raise SchemaError("block_hashes is not an array")
            d = {"type": tag, "block_hashes": [_hash(h) for h in ev[1]],
                 "medium": _opt(ev[2], _str, "medium")}
        elif tag == "AllBlocksCleared":
            if len(ev) != 1:
                raise SchemaError("AllBlocksCleared with fields")
            d = {"type": tag}
        else:
            raise SchemaError("unknown tag %r" % (tag,))
        out.append(d)
    return {"ts": ts, "data_parallel_rank": rank, "events": out}


def test_decoder_is_strict():
    """The decoder refuses what msgspec would: a wrong tag, count or type."""
    good = ["BlockStored", [1], None, [1] * BT, BT, None, "CPU", None]
    decode_batch(msgpack.packb([1.0, [good], 0]))
    bad = [
        [1.0, [good[:-1]], 0],                       # a field short
        [1.0, [good + [None]], 0],                   # a field too many
        [1.0, [["BlockStore"] + good[1:]], 0],       # unknown tag
        [1.0, [good[:1] + ["x"] + good[2:]], 0],     # hashes not an array
        [1.0, [good[:2] + [1.5] + good[3:]], 0],     # parent a float
        [1.0, [good[:6] + [3] + good[7:]], 0],       # medium an int
        [1, [good], 0],                              # ts an int
        [1.0, [["BlockRemoved", [1]]], 0],           # medium missing
        [1.0, [["AllBlocksCleared", 1]], 0],
        [1.0, [good], "0"],
        [1.0, [good[:4] + [True] + good[5:]], 0],    # a bool for an int
    ]
    for b in bad:
        with pytest.raises(SchemaError):
            decode_batch(msgpack.packb(b))
    with pytest.raises(SchemaError):
        decode_batch(msgpack.packb([1.0, [], 0]) + b"\x00")


# ------------------------------------------------------------ the daemon

class Daemon:
    def __init__(self, tmp, *args, pool="256K", events=True):
        self.dir = tmp
        self.sock = os.path.join(tmp, "kvcached.sock")
        self.ev = "ipc://" + os.path.join(tmp, "ev")
        self.rp = "ipc://" + os.path.join(tmp, "rp")
        argv = [KVCACHED, "--socket", self.sock, "--page-size", "4K", "--pool-size", pool,
                "--hugepages", "off", "--tick-ms", "5", "--log-level", "debug"]
        if events:
            argv += ["--kv-events", self.ev, "--kv-events-replay", self.rp]
        argv += list(args)
        self.log = open(os.path.join(tmp, "kvcached.log"), "w")
        self.proc = subprocess.Popen(argv, stderr=self.log)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kvcached exited: " + self.log_text())
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(self.sock)
                return
            except OSError:
                time.sleep(0.01)
            finally:
                s.close()
        raise RuntimeError("kvcached did not start")

    def log_text(self):
        with open(os.path.join(self.dir, "kvcached.log")) as f:
            return f.read()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=20)
        self.log.close()
        return rc

    def kvev(self, *args):
        r = subprocess.run([KVEV, args[0], self.sock] + [str(a) for a in args[1:]],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return [json.loads(line) for line in r.stdout.splitlines()]

    def counters(self):
        r = subprocess.run([KVSTAT, "--socket", self.sock, "--json"], capture_output=True,
                           text=True, timeout=20)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)


@pytest.fixture
def tmp():
    with tempfile.TemporaryDirectory(prefix="kvt-ev.") as d:
        yield d


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


class Sub:
    """A subscriber: live batches by sequence number, with their topics."""

    def __init__(self, ctx, daemon, rcvhwm=None):
        self.d = daemon
        self.ctx = ctx
        self.s = ctx.socket(zmq.SUB)
        if rcvhwm is not None:
            self.s.setsockopt(zmq.RCVHWM, rcvhwm)
            self.s.setsockopt(zmq.RCVBUF, 4096)
        self.s.connect(daemon.ev)
        self.s.setsockopt(zmq.SUBSCRIBE, b"")
        self.batches = {}

    def recv_some(self, ms):
        got = 0
        while self.s.poll(ms):
            topic, seq, payload = self.s.recv_multipart()
            assert len(seq) == 8
            self.batches[int.from_bytes(seq, "big")] = (topic.decode(), decode_batch(payload))
            got += 1
            ms = 0
        return got

    def sync(self):
        """Publish probes until one arrives: from then on nothing is
        missed for joining late (ZMQ's PUB/SUB drops what comes before a
        subscription reaches the publisher). What came before, the probes
        the subscription missed, comes from the replay socket, as a
        subscriber that joins late gets it: the stream is whole from 0."""
        for i in range(200):
            self.d.kvev("put", "probe", 16, 0, 90000 + i)
            if self.recv_some(50):
                first = min(self.batches)
                topic = self.batches[first][0]
                for seq, b in replay(self.ctx, self.d, 0).items():
                    if seq < first:
                        self.batches[seq] = (topic, b)
                assert sorted(self.batches) == list(range(max(self.batches) + 1))
                return
        raise AssertionError("no event reached the subscriber")

    def drain(self):
        """Receive until every batch the daemon made has arrived (its
        counters say how many), the daemon quiet for a moment."""
        last = None
        deadline = time.time() + 30
        while time.time() < deadline:
            self.recv_some(20)
            c = self.d.counters()["counters"]
            made = c["kv_event_batches"] + c["kv_event_drops"]
            if made == last and self.batches and max(self.batches) + 1 == made:
                return c
            last = made
        raise AssertionError("events did not arrive: have %d, counters %r" %
                             (len(self.batches), self.d.counters()["counters"]))

    def events(self, since=0):
        for seq in sorted(self.batches):
            if seq >= since:
                topic, b = self.batches[seq]
                for ev in b["events"]:
                    yield seq, topic, ev


@contextlib.contextmanager
def publishing(tmp, ctx, *args, **kw):
    """A daemon with KV events and a subscriber already synced to it;
    the daemon must stop cleanly at the end."""
    d = Daemon(tmp, *args, **kw)
    try:
        sub = Sub(ctx, d)
        sub.sync()
        yield d, sub
    finally:
        assert d.stop() == 0


def replay(ctx, daemon, start=0):
    """Ask the replay socket for everything from `start` (a DEALER: a REQ
    socket takes one reply per request). Returns {seq: decoded batch}."""
    s = ctx.socket(zmq.DEALER)
    s.connect(daemon.rp)
    s.send_multipart([b"", start.to_bytes(8, "big")])
    out = {}
    try:
        while True:
            assert s.poll(10000), "replay did not end"
            empty, seq, payload = s.recv_multipart()
            assert empty == b""
            seq = int.from_bytes(seq, "big")
            if seq == END:
                assert payload == b""
                return out
            out[seq] = decode_batch(payload)
    finally:
        s.close(linger=0)


def key_hash(key_hex, form="uint64"):
    """The hash a block of this 128-bit key (hi:lo hex) gets."""
    k = int(key_hex, 16)
    lo = k & ((1 << 64) - 1)
    if form == "int64":
        return lo - (1 << 64) if lo >= 1 << 63 else lo
    if form == "bytes":
        return k.to_bytes(16, "big")
    return lo


def state_from(events, media=None):
    """Replay events into {(medium, hash)}; checks each removal names a
    block the stream stored before (in that medium)."""
    held = set()
    for _, _, ev in events:
        if ev["type"] == "BlockStored":
            for h in ev["block_hashes"]:
                held.add((ev["medium"], h))
        elif ev["type"] == "BlockRemoved":
            for h in ev["block_hashes"]:
                assert (ev["medium"], h) in held, "removed before stored: %r" % (h,)
                held.discard((ev["medium"], h))
        else:
            held.clear()
    return held


# ------------------------------------------------------------ the tests

def maps_of(pid):
    with open("/proc/%d/maps" % pid) as f:
        return f.read()


def test_no_library_without_the_flag(tmp):
    d = Daemon(tmp, events=False)
    try:
        m = maps_of(d.proc.pid)
        assert "libzmq" not in m and "msgpack" not in m
        assert d.counters()["counters"]["kv_events_enabled"] == 0
    finally:
        assert d.stop() == 0
    d = Daemon(tmp)
    try:
        m = maps_of(d.proc.pid)
        assert "libzmq" in m          # loaded now, by dlopen
        assert "msgpack" not in m     # the packer is header-only
        assert d.counters()["counters"]["kv_events_enabled"] == 1
        # libzmq's threads never take SIGTERM (it belongs to the main
        # loop's signalfd): they start with every signal blocked.
        zthreads = 0
        for t in os.listdir("/proc/%d/task" % d.proc.pid):
            with open("/proc/%d/task/%s/comm" % (d.proc.pid, t)) as f:
                if not f.read().startswith("ZMQ"):
                    continue
            with open("/proc/%d/task/%s/status" % (d.proc.pid, t)) as f:
                blk = int(next(l for l in f if l.startswith("SigBlk:")).split()[1], 16)
            assert blk & (1 << (signal.SIGTERM - 1)) and blk & (1 << (signal.SIGINT - 1))
            zthreads += 1
        assert zthreads >= 1
    finally:
        assert d.stop() == 0


def test_block_stored_per_published_block(tmp, ctx):
    with publishing(tmp, ctx) as (d, sub):
        first = max(sub.batches) + 1
        # Two prompts sharing two blocks, then the first again (all hits).
        prompts = d.kvev("put", "kvt-tiny", 64, 32, 11, 12, 11)
        c = sub.drain()
        stored = {}
        for seq, topic, ev in sub.events(first):
            assert topic == "kv@%s@kvt-tiny" % socket.gethostname()
            assert ev["type"] == "BlockStored"
            assert ev["block_size"] == BT and ev["medium"] == "CPU"
            assert ev["lora_id"] is None and ev["lora_name"] is None
            n = len(ev["block_hashes"])
            assert len(ev["token_ids"]) == n * BT
            parent = ev["parent_block_hash"]
            for i, h in enumerate(ev["block_hashes"]):
                assert h not in stored, "block stored twice"
                stored[h] = (parent, ev["token_ids"][i * BT:(i + 1) * BT])
                parent = h
        want = set()
        for p in prompts:
            hashes = [key_hash(k) for k in p["keys"]]
            for i, h in enumerate(hashes):
                if i < p["hits"]:
                    continue          # cached already: nothing new
                want.add(h)
                parent, tokens = stored[h]
                assert tokens == p["tokens"][i * BT:(i + 1) * BT]
                # The chain: each block's parent is the previous block.
                assert parent == (hashes[i - 1] if i else None)
        assert set(stored) == want
        assert len(want) == 6         # 4 + 2 new, the third prompt all hits
        for _, b in sub.batches.values():
            assert b["data_parallel_rank"] == 0
        assert c["kv_event_drops"] == 0
        assert c["kv_events"] == sum(len(b["events"]) for _, b in sub.batches.values())


def test_engine_keyed_namespace_is_muted(tmp, ctx):
    """An engine-keyed namespace (SGLang's page hashes, KVC_MODEL_ENGINE_KEYS)
    publishes no events: its stored "tokens" are digests of the engine's
    keys, which no router could match. A token-keyed namespace of the same
    daemon goes on publishing."""
    import kvclient
    with publishing(tmp, ctx) as (d, sub):
        first = max(sub.batches) + 1
        m = kvclient.Model("kvt-engine", "float16", layers=1, kv_heads=2, head_dim=32,
                           block_tokens=BT, keys="engine")
        with kvclient.Client(m, socket=d.sock) as c, c.request_keys(["a", "b", "c"]) as r:
            r.lookup()
            assert r.alloc() == 3
            assert r.publish() == 3
        p = d.kvev("put", "kvt-tiny", 32, 0, 31)[0]
        sub.drain()
        stored = [(t, h) for _, t, ev in sub.events(first) if ev["type"] == "BlockStored"
                  for h in ev["block_hashes"]]
        host = socket.gethostname()
        assert stored == [("kv@%s@kvt-tiny" % host, key_hash(k)) for k in p["keys"]]


@pytest.mark.parametrize("form", ["int64", "bytes"])
def test_hash_forms(tmp, ctx, form):
    with publishing(tmp, ctx, "--kv-events-hash", form, "--kv-events-topic", "{model}") as (d, sub):
        first = max(sub.batches) + 1
        p = d.kvev("put", "kvt-tiny", 128, 0, 21)[0]
        sub.drain()
        got = [h for _, t, ev in sub.events(first) for h in ev["block_hashes"]]
        assert {t for _, t, _ in sub.events(first)} == {"kvt-tiny"}
        assert got == [key_hash(k, form) for k in p["keys"]]
        if form == "int64":
            assert all(-(1 << 63) <= h < 1 << 63 for h in got)


def test_block_removed_per_eviction(tmp, ctx):
    with publishing(tmp, ctx, pool="256K") as (d, sub):  # 64 pages
        for seed in range(0, 30, 10):
            d.kvev("put", "kvt-tiny", 64, 0, *range(100 + seed, 110 + seed))
        c = sub.drain()
        removed = [h for _, _, ev in sub.events() if ev["type"] == "BlockRemoved"
                   for h in ev["block_hashes"]]
        assert all(ev["medium"] == "CPU" for _, _, ev in sub.events())
        assert c["evictions"] > 0
        assert len(removed) == c["evictions"]
        held = state_from(sub.events())
        assert len(held) == c["index_entries"]


def test_spill_medium_and_late_replay(tmp, ctx):
    spill = os.path.join(tmp, "spill")
    with publishing(tmp, ctx, "--spill-dir", spill, "--spill-size", "1M", pool="256K") as (d, sub):
        for seed in range(0, 40, 10):
            d.kvev("put", "kvt-tiny", 64, 0, *range(200 + seed, 210 + seed))
        c = sub.drain()
        assert c["spills"] > 0
        # Every block stored on DISK left CPU first (same batch or before).
        where = {}
        for _, _, ev in sub.events():
            for h in ev.get("block_hashes", []):
                if ev["type"] == "BlockStored":
                    assert h not in where, "stored in %s and %s" % (where.get(h), ev["medium"])
                    where[h] = ev["medium"]
                elif ev["type"] == "BlockRemoved":
                    assert where.pop(h) == ev["medium"]
        disk = [h for h, m in where.items() if m == "DISK"]
        stored_disk = sum(len(ev["block_hashes"]) for _, _, ev in sub.events()
                          if ev["type"] == "BlockStored" and ev["medium"] == "DISK")
        assert stored_disk == c["spills"] + c["spill_clean"]
        assert len(disk) == c["pages_spilled"]
        assert len(where) - len(disk) == c["pages_ready"]

        # Restore the oldest prompt: out of DISK, back into CPU.
        mark = max(sub.batches) + 1
        r = d.kvev("restore", "kvt-tiny", 64, 0, 200)[0]
        assert r["spilled"] > 0 and r["restored"] > r["hits"]
        sub.drain()
        p = d.kvev("put", "kvt-tiny", 64, 0, 200)[0]   # now all hits
        assert p["hits"] == 4
        sub.drain()
        moved = [ev for _, _, ev in sub.events(mark)]
        restored = {key_hash(k) for k in p["keys"][r["hits"]:r["restored"]]}
        out_disk = {h for ev in moved if ev["type"] == "BlockRemoved" and ev["medium"] == "DISK"
                    for h in ev["block_hashes"]}
        in_cpu = {h for ev in moved if ev["type"] == "BlockStored" and ev["medium"] == "CPU"
                  for h in ev["block_hashes"]}
        assert restored <= out_disk and restored <= in_cpu

        # A subscriber that comes now rebuilds the same set from seq 0.
        live = state_from(sub.events())
        late = replay(ctx, d, 0)
        assert sorted(late) == list(range(max(sub.batches) + 1))
        rebuilt = state_from((s, None, ev) for s in sorted(late) for ev in late[s]["events"])
        assert rebuilt == live
        assert d.counters()["counters"]["kv_event_replays"] >= 1


def test_all_blocks_cleared_when_a_namespace_is_dropped(tmp, ctx):
    with publishing(tmp, ctx) as (d, sub):
        # The probe took a row; 64 more models fill the table and the
        # last one takes over the row of a model without clients.
        d.kvev("models", "m", 64, 32)
        sub.drain()
        cleared = [(s, t) for s, t, ev in sub.events() if ev["type"] == "AllBlocksCleared"]
        assert len(cleared) == 1
        seq, topic = cleared[0]
        before = [ev for s, t, ev in sub.events() if t == topic and s < seq]
        assert any(ev["type"] == "BlockStored" for ev in before)
        # Nothing of that namespace is held after it.
        held = state_from((s, t, ev) for s, t, ev in sub.events() if t == topic)
        assert not held
        assert "replaces" in d.log_text()


def test_flood_with_a_subscriber_that_never_reads(tmp, ctx):
    d = Daemon(tmp, "--kv-events-hwm", "2", "--kv-events-stall-ms", "200", pool="1M")
    try:
        good = Sub(ctx, d)
        good.sync()
        stuck = Sub(ctx, d, rcvhwm=1)  # connects, never reads
        good.sync()                    # ... and its subscription is in
        start = max(good.batches) + 1
        flood = subprocess.Popen([KVEV, "flood", d.sock, "kvt-tiny", "3000", "500"],
                                 stdout=subprocess.PIPE, text=True)
        while flood.poll() is None:
            good.recv_some(5)
        out, _ = flood.communicate(timeout=60)
        # Every publish completed and the daemon still answers.
        assert flood.returncode == 0
        assert json.loads(out)["published"] == 3000
        c = d.counters()["counters"]
        assert c["kv_event_drops"] > 0
        assert c["publishes"] >= 3000 * 8
        # Once the stalled queue has been full for 200 ms, it alone loses
        # batches: the good subscriber gets them again.
        seen = max(good.batches)
        for i in range(400):
            d.kvev("put", "kvt-tiny", 16, 0, 70000 + i)
            good.recv_some(20)
            if max(good.batches) > seen and d.counters()["counters"]["kv_events_lossy"]:
                break
        else:
            raise AssertionError("the stalled subscriber holds up the others")
        # The good subscriber saw the gap in the sequence numbers, and
        # gets what it missed from the replay buffer.
        seqs = sorted(s for s in good.batches if s >= start)
        missing = set(range(start, seqs[-1] + 1)) - set(seqs)
        assert missing
        late = replay(ctx, d, start)
        assert missing <= set(late)
        # The stalled one leaves: soon every loss is counted again.
        stuck.s.close(linger=0)
        for i in range(400):
            d.kvev("put", "kvt-tiny", 16, 0, 80000 + i)
            good.recv_some(20)
            if not d.counters()["counters"]["kv_events_lossy"]:
                break
        else:
            raise AssertionError("NODROP did not come back")
        assert "a subscriber has not read" in d.log_text()
    finally:
        assert d.stop() == 0


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_replay_requests_do_not_grow_the_daemon(tmp, ctx):
    """Twelve peers ask for "replay from 0" every 20 ms and never read. The
    daemon answers each peer with one replay at a time (a repeated request
    does not restart it), sends the ring's own buffers rather than copies,
    and stops sending to a peer whose queue is full: its memory stays
    within a bound, and an honest publish and replay still go through."""
    d = Daemon(tmp, "--kv-events-buffer", "100000", pool="1M")
    peers = []
    try:
        sub = Sub(ctx, d)
        sub.sync()
        flood = subprocess.run([KVEV, "flood", d.sock, "kvt-tiny", "1500", "900"],
                               capture_output=True, text=True, timeout=300)
        assert flood.returncode == 0, flood.stderr
        before = rss_kib(d.proc.pid)
        for _ in range(12):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.RCVHWM, 1)
            s.setsockopt(zmq.RCVBUF, 4096)
            s.connect(d.rp)
            peers.append(s)
        peak = before
        for _ in range(75):	# 1.5 s
            for s in peers:
                s.send_multipart([b"", (0).to_bytes(8, "big")])
            time.sleep(0.02)
            peak = max(peak, rss_kib(d.proc.pid))
        c = d.counters()["counters"]
        print(f"daemon RSS {before} KiB before, peak {peak} KiB; "
              f"replays {c['kv_event_replays']}, refused {c['kv_event_replay_errors']}")
        # A resource bound, not a timing: the copies grew it by hundreds
        # of MiB within the second.
        assert peak - before < 64 * 1024
        # The daemon still serves: a publish, and another peer's replay.
        d.kvev("put", "kvt-tiny", 16, 0, 99001)
        assert replay(ctx, d, max(sub.batches) + 1) is not None
    finally:
        for s in peers:
            s.close(linger=0)
        assert d.stop() == 0
