# SPDX-License-Identifier: MIT
"""KV events for cluster routers, end to end (docs/EVENTS.md).

A real kvcached is started on a private socket with --kv-events on ipc://
endpoints, real clients (tests/helpers/kvev.c, on libkvclient) publish,
and subscribers written with Debian's python3-zmq decode every batch the
way vLLM's msgspec decoder would, from the field lists of vLLM's structs
in both encodings: strict tags, fields and types (decode_batch below).

What it shows: a BlockStored for every published block (hashes chained,
the prompt's token ids); the three hash forms; both encodings (tagged
arrays, maps); a BlockRemoved for every eviction; a removal plus a store
with medium DISK for every spilled block and the reverse for a restore;
a namespace dropped or reclaimed as one BlockRemoved per block, never
AllBlocksCleared, so that a router that keys by pod (as llm-d does) keeps
the other models' blocks; the host pool's medium name; a late subscriber
that replays from sequence 0 rebuilding the same set of blocks, and a
REQ socket that replays one batch per request; a flood with a subscriber that never reads, where
the clients never stall and the dropped batches are counted (and the
sequence gap shows, and replay fills it); and that the daemon maps no
libzmq, nor any msgpack library, without --kv-events.
"""
import contextlib
import json
import os
import re
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


# The fields of vLLM's event structs in declaration order, each with the
# check of its type, as vllm/distributed/kv_events.py declares them
# (docs/EVENTS.md names the versions read); the first REQUIRED have no
# default, the others default to None and msgspec leaves them out when
# they are. The array form (array_like=True, vLLM up to 0.23) writes them
# by position after the tag, ending anywhere from REQUIRED on, with none
# past ARRAY_MAX (locality came with the map form); the map form (0.24
# on) names them, the tag under "type".
def _hashes(x):
    if type(x) is not list:
        raise SchemaError("block_hashes is not an array")
    return [_hash(h) for h in x]


def _tokens(x):
    if type(x) is not list or not all(_int(t) for t in x):
        raise SchemaError("token_ids is not an array of int")
    return x


def _size(x):
    if not _int(x):
        raise SchemaError("block_size is not an int")
    return x


def _extra_keys(x):
    if x is not None and (type(x) is not list or
                          not all(k is None or type(k) is list for k in x)):
        raise SchemaError("extra_keys is not a list of tuples or None")
    return x


KINDS = {
    "BlockStored": (7, 11, [
        ("block_hashes", _hashes),
        ("parent_block_hash", lambda x: None if x is None else _hash(x)),
        ("token_ids", _tokens),
        ("block_size", _size),
        ("lora_id", lambda x: _opt(x, _int, "lora_id")),
        ("medium", lambda x: _opt(x, _str, "medium")),
        ("lora_name", lambda x: _opt(x, _str, "lora_name")),
        ("extra_keys", _extra_keys),
        ("group_idx", lambda x: _opt(x, _int, "group_idx")),
        ("kv_cache_spec_kind", lambda x: _opt(x, _str, "kv_cache_spec_kind")),
        ("kv_cache_spec_sliding_window", lambda x: _opt(x, _int, "sliding window")),
        ("locality", lambda x: _opt(x, _str, "locality")),
    ]),
    "BlockRemoved": (2, 3, [
        ("block_hashes", _hashes),
        ("medium", lambda x: _opt(x, _str, "medium")),
        ("group_idx", lambda x: _opt(x, _int, "group_idx")),
        ("locality", lambda x: _opt(x, _str, "locality")),
    ]),
    "AllBlocksCleared": (0, 0, []),
}


def decode_event(ev):
    """One event, a tagged array or a tagged map, as msgspec decodes
    vLLM's structs: {"type", every field (None where left out), "form",
    "carried": the defaulted fields it carried}. Stricter than msgspec in
    one thing: a map field no struct declares is refused (msgspec ignores
    it), so the tests see kvcached send nothing else."""
    if type(ev) is list and ev and type(ev[0]) is str:
        form, tag, vals = "array", ev[0], ev[1:]
    elif type(ev) is dict:
        form, tag = "map", ev.get("type")
        if type(tag) is not str:
            raise SchemaError("event map %r has no str \"type\"" % (ev,))
    else:
        raise SchemaError("event %r is neither a tagged array nor a map" % (ev,))
    if tag not in KINDS:
        raise SchemaError("unknown tag %r" % (tag,))
    required, array_max, fields = KINDS[tag]
    names = [n for n, _ in fields]
    if form == "array":
        if not required <= len(vals) <= array_max:
            raise SchemaError("%s with %d fields" % (tag, len(vals)))
        got = dict(zip(names, vals))
    else:
        got = {k: v for k, v in ev.items() if k != "type"}
        unknown = set(got) - set(names)
        if unknown:
            raise SchemaError("%s with fields no struct declares: %r" % (tag, unknown))
        missing = [n for n in names[:required] if n not in got]
        if missing:
            raise SchemaError("%s without %r" % (tag, missing))
    d = {"type": tag, "form": form, "carried": sorted(set(got) & set(names[required:]))}
    for name, check in fields:
        d[name] = check(got[name]) if name in got else None
    return d


def decode_batch(payload):
    """Decode one payload as msgspec decodes vLLM's KVEventBatch: the
    batch an array [ts, events, data_parallel_rank] (rank omitted when
    None), each event either form. Returns {"ts", "data_parallel_rank",
    "events": [dict, ...]}."""
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
    return {"ts": ts, "data_parallel_rank": rank, "events": [decode_event(e) for e in events]}


def as_map(ev):
    """The map form of an array-form event (vLLM 0.24 on)."""
    tag, vals = ev[0], ev[1:]
    return dict([("type", tag)] + list(zip([n for n, _ in KINDS[tag][2]], vals)))


def test_decoder_is_strict():
    """The decoder takes every event kind in both forms, and the fields
    newer vLLM carries, and refuses what msgspec would: a wrong tag,
    count or type, a missing field; and a map field no struct declares."""
    good = ["BlockStored", [1], None, [1] * BT, BT, None, "CPU", None]
    removed = ["BlockRemoved", [1, b"\x01" * 16], "GPU"]
    for ev in (good, removed, ["AllBlocksCleared"],
               good + [[None], 0, "full_attention"],      # vLLM 0.23 array, defaults set
               removed + [0]):
        for form in (ev, as_map(ev)):
            b = decode_batch(msgpack.packb([1.0, [form], 0]))
            d = b["events"][0]
            assert d["type"] == ev[0]
            assert d["form"] == ("map" if form is not ev else "array")
            assert len(d["carried"]) == len(ev) - 1 - KINDS[ev[0]][0]
    # vLLM 0.26's map, as a subscriber received it (kthena issue #1535).
    d = decode_event({"type": "BlockStored", "block_hashes": [15760518052499183552],
                      "parent_block_hash": None, "token_ids": [1] * BT, "block_size": BT,
                      "lora_id": None, "medium": "GPU", "lora_name": None,
                      "extra_keys": [None], "group_idx": 0,
                      "kv_cache_spec_kind": "full_attention"})
    assert d["carried"] == ["extra_keys", "group_idx", "kv_cache_spec_kind"]
    bad = [
        [1.0, [good[:-1]], 0],                       # a field short
        [1.0, [good + [None] * 5], 0],               # past what any vLLM declares
        [1.0, [["BlockStore"] + good[1:]], 0],       # unknown tag
        [1.0, [good[:1] + ["x"] + good[2:]], 0],     # hashes not an array
        [1.0, [good[:2] + [1.5] + good[3:]], 0],     # parent a float
        [1.0, [good[:6] + [3] + good[7:]], 0],       # medium an int
        [1, [good], 0],                              # ts an int
        [1.0, [["BlockRemoved", [1]]], 0],           # medium missing
        [1.0, [["AllBlocksCleared", 1]], 0],
        [1.0, [good], "0"],
        [1.0, [good[:4] + [True] + good[5:]], 0],    # a bool for an int
        [1.0, [dict(as_map(good), pod="x")], 0],     # a field no struct declares
        [1.0, [{k: v for k, v in as_map(good).items() if k != "medium"}], 0],
        [1.0, [{k: v for k, v in as_map(good).items() if k != "type"}], 0],
        [1.0, [dict(as_map(good), type="Stored")], 0],
        [1.0, [dict(as_map(good), group_idx="0")], 0],
        [1.0, [dict(as_map(removed), block_hashes=[1.5])], 0],
        {"ts": 1.0, "events": [good], "data_parallel_rank": 0},  # the batch a map
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
    block the stream stored before (in that medium). kvcached never sends
    AllBlocksCleared (a router that keys by pod would clear the host)."""
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
            raise AssertionError("kvcached sent %r" % (ev,))
    return held


class PodIndex:
    """An index kept the way llm-d's KV cache manager keeps it (pool.go of
    llm-d/llm-d-kv-cache, as read; docs/EVENTS.md): the pod and the model
    come from the topic, kv@<pod>@<model>; a stored block is an entry
    (pod, tier) under (model, hash), the tier the medium in lower case; a
    BlockRemoved drops that pod's entry of that tier; AllBlocksCleared
    drops every entry of the pod, every model and tier
    (p.index.Clear(ctx, podIdentifier))."""

    def __init__(self):
        self.entries = {}

    def apply(self, topic, batch):
        _, pod, model = topic.split("@")
        for ev in batch["events"]:
            tier = (ev.get("medium") or "GPU").lower()
            if ev["type"] == "BlockStored":
                for h in ev["block_hashes"]:
                    self.entries.setdefault((model, h), set()).add((pod, tier))
            elif ev["type"] == "BlockRemoved":
                for h in ev["block_hashes"]:
                    self.entries.get((model, h), set()).discard((pod, tier))
            else:
                for e in self.entries.values():
                    e -= {x for x in e if x[0] == pod}

    def held(self, pod, model):
        return {h for (m, h), e in self.entries.items()
                if m == model and any(p == pod for p, _ in e)}


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


def test_reclaimed_namespace_is_removed_block_by_block(tmp, ctx):
    with publishing(tmp, ctx, pool="1M") as (d, sub):    # nothing evicted for room
        # The probe took a row; 64 more models fill the table and the
        # last one takes over the row of a model without clients.
        d.kvev("models", "m", 64, 32)
        sub.drain()
        gone = re.search(r"replaces (\S+), which had no clients", d.log_text()).group(1)
        topic = "kv@%s@%s" % (socket.gethostname(), gone)
        # Its blocks, and only its, left the stream: each with a
        # BlockRemoved on its own topic (state_from refuses
        # AllBlocksCleared).
        topics = {t for _, t, _ in sub.events()}
        emptied = [t for t in topics
                   if not state_from((s, t2, ev) for s, t2, ev in sub.events() if t2 == t)]
        assert emptied == [topic]
        stored = sum(len(ev["block_hashes"]) for _, t, ev in sub.events()
                     if t == topic and ev["type"] == "BlockStored")
        removed = sum(len(ev["block_hashes"]) for _, t, ev in sub.events()
                      if t == topic and ev["type"] == "BlockRemoved")
        assert stored == removed >= 1


def test_drop_leaves_other_models_to_a_pod_keyed_router(tmp, ctx):
    """Two models publish on one host, then one drops its namespace (as
    kvbench does when it is done): a router that keys by pod, as llm-d
    does, still holds every block of the other model, and nothing of the
    dropped one, in any tier. (kvcached sent AllBlocksCleared on the
    dropped model's topic, and llm-d clears the whole pod on that.)"""
    spill = os.path.join(tmp, "spill")
    with publishing(tmp, ctx, "--spill-dir", spill, "--spill-size", "1M",
                    pool="256K") as (d, sub):               # 64 pages
        # Model a: 80 blocks, so that its oldest go to DISK; then model b,
        # whose 8 blocks push 8 more of a's out.
        for seed in range(0, 20, 5):
            d.kvev("put", "kvt-a", 64, 0, *range(300 + seed, 305 + seed))
        b = d.kvev("put", "kvt-b", 64, 0, 401, 402)
        c = sub.drain()
        assert c["spills"] > 0
        host = socket.gethostname()
        b_blocks = {key_hash(k) for p in b for k in p["keys"]}
        ta, tb = "kv@%s@kvt-a" % host, "kv@%s@kvt-b" % host
        index = PodIndex()
        for seq in sorted(sub.batches):
            index.apply(*sub.batches[seq])
        assert index.held(host, "kvt-b") == b_blocks
        a_before = state_from(ev for ev in sub.events() if ev[1] == ta)
        assert {m for m, _ in a_before} == {"CPU", "DISK"}
        mark = max(sub.batches) + 1

        assert d.kvev("drop", "kvt-a")[0]["dropped"] > 0
        sub.drain()
        for seq in sorted(sub.batches):
            if seq >= mark:
                index.apply(*sub.batches[seq])
        assert index.held(host, "kvt-b") == b_blocks
        assert index.held(host, "kvt-a") == set()
        # The drop: one BlockRemoved per block model a held, on its own
        # topic, in the medium it was in; nothing on model b's.
        dropped = [(t, ev) for _, t, ev in sub.events(mark)]
        assert {t for t, _ in dropped} == {ta}
        assert all(ev["type"] == "BlockRemoved" for _, ev in dropped)
        assert {(ev["medium"], h) for _, ev in dropped
                for h in ev["block_hashes"]} == a_before
        assert state_from(ev for ev in sub.events() if ev[1] == ta) == set()


@pytest.mark.parametrize("form", ["array", "map"])
def test_both_encodings(tmp, ctx, form):
    """--kv-events-format: every event of a run (stores, evictions, spills,
    a drop) in the form asked for, decoded by the struct-field decoder,
    carrying no defaulted field; map is the default."""
    spill = os.path.join(tmp, "spill")
    args = ["--spill-dir", spill, "--spill-size", "1M"]
    if form == "array":
        args += ["--kv-events-format", "array"]
    with publishing(tmp, ctx, *args, pool="256K") as (d, sub):
        for seed in range(0, 20, 5):
            d.kvev("put", "kvt-tiny", 64, 0, *range(500 + seed, 505 + seed))
        d.kvev("drop", "kvt-tiny")
        sub.drain()
        kinds = {(ev["type"], ev["medium"]) for _, _, ev in sub.events()}
        assert kinds >= {("BlockStored", "CPU"), ("BlockRemoved", "CPU"),
                         ("BlockStored", "DISK"), ("BlockRemoved", "DISK")}
        for _, _, ev in sub.events():
            assert ev["form"] == form and ev["carried"] == []
        assert state_from(ev for ev in sub.events() if ev[1].endswith("@kvt-tiny")) == set()


def test_host_medium(tmp, ctx):
    """--kv-events-host-medium names the host pool's medium (CPU_PINNED:
    SGLang's router's name); the spill tier stays DISK."""
    spill = os.path.join(tmp, "spill")
    with publishing(tmp, ctx, "--kv-events-host-medium", "CPU_PINNED", "--spill-dir", spill,
                    "--spill-size", "1M", pool="256K") as (d, sub):
        for seed in range(0, 20, 5):
            d.kvev("put", "kvt-tiny", 64, 0, *range(600 + seed, 605 + seed))
        sub.drain()
        assert {ev["medium"] for _, _, ev in sub.events()} == {"CPU_PINNED", "DISK"}


def test_replay_with_a_req_socket(tmp, ctx):
    """vLLM's example subscriber asks the replay socket with a REQ socket,
    which takes one message per request and drops what else arrived when
    it sends the next. Asking from the sequence after each one it got, it
    gets every batch the DEALER replay does, in order, then the end
    marker. (kvcached streamed the whole answer to it, and ignored its
    next request while that ran: past 64 batches it got gaps.)"""
    with publishing(tmp, ctx, pool="1M") as (d, sub):
        # More batches than the 64 messages a replay peer may have queued:
        # a streamed answer is still being sent when the next request comes.
        # (A batch per tick: floods until there are enough of them.)
        for i in range(50):
            if max(sub.batches) > 80:
                break
            flood = subprocess.Popen([KVEV, "flood", d.sock, "kvt-tiny", "500", str(700 + i)],
                                     stdout=subprocess.PIPE, text=True)
            while flood.poll() is None:
                sub.recv_some(5)
            assert flood.wait(timeout=60) == 0
            sub.drain()
        want = replay(ctx, d, 0)
        assert len(want) > 80
        s = ctx.socket(zmq.REQ)
        s.connect(d.rp)
        got, nxt = {}, 0
        try:
            while True:
                s.send(nxt.to_bytes(8, "big"))
                assert s.poll(5000), "no answer to a REQ replay request"
                seq, payload = s.recv_multipart()
                seq = int.from_bytes(seq, "big")
                if seq == END:
                    assert payload == b""
                    break
                assert seq == nxt, "asked from %d, got %d" % (nxt, seq)
                got[seq] = decode_batch(payload)
                nxt = seq + 1
        finally:
            s.close(linger=0)
        assert got == want


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
