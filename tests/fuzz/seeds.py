#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the seed corpora of the fuzz targets into tests/fuzz/corpus/.

The seeds are committed; this script only documents (and regenerates) how
they were made: `python3 tests/fuzz/seeds.py`. Each seed is a small valid
(or deliberately broken) input in the format its target reads; see the
comment at the top of tests/fuzz/<target>.c for the formats.
"""
import os
import re
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MAGIC = 0x4B564331
HELLO, HELLO_R, ALLOC, ALLOC_R, PUBLISH, PUBLISH_R = 1, 2, 3, 4, 5, 6
FREE, FREE_R, ERROR, STAT, STAT_R, BYE = 7, 8, 9, 10, 11, 12
RESTORE, RESTORE_R = 13, 14
POOL, POOL_R = 32, 33
DROP, DROP_R, RESET, RESET_R = 50, 51, 52, 53
ADMIN, ADMIN_R, PIN, PIN_R, UNPIN, UNPIN_R = 54, 55, 56, 57, 58, 59
A_DROP_NS, A_DROP_TENANT, A_PIN, A_UNPIN = 1, 2, 3, 4
ANY = 0xFFFFFFFF
FETCH, FETCH_R = 60, 61
ALLOC_KEYS = 40
ALLOC_SINGLE = 1
VERSION = 4  # KVPROTO_VERSION


def frame(typ, payload=b"", seq=1, magic=MAGIC, length=None):
    n = len(payload) if length is None else length
    return struct.pack("<IHHII", magic, typ, 0, n, seq) + payload


def hello(model=b"llama-3-8b", bt=16, layers=1, kv=1, hd=64, dtype=2,
          pos=1, pins=0, name=b"fuzz", version=VERSION, flags=0, shard=(0, 0, 0, 0),
          share=0, salt=b""):
    """struct kvproto_hello of protocol 4: the shard follows the name, then
    the share asked for, the salt's length and 256 bytes of salt."""
    return struct.pack("<10I", version, flags, dtype, layers, kv, hd, bt,
                       pos, pins, 0) + model.ljust(64, b"\0")[:64] + \
        name.ljust(16, b"\0")[:16] + struct.pack("<4H", *shard) + \
        struct.pack("<II", share, len(salt)) + salt.ljust(256, b"\0")[:256]


def alloc(n, flags=0):
    return struct.pack("<II", n, flags)


def pgs(pairs):
    return struct.pack("<II", len(pairs), 0) + b"".join(
        struct.pack("<II", p, g) for p, g in pairs)


def pub(recs, bt=16):
    """recs: (page, gen, key, parent, first_token); a key is lo or (lo, hi).
    A record is struct kvproto_pub (page, gen, key, parent, extra digest)."""
    out = struct.pack("<II", len(recs), 0)
    for page, gen, key, parent, tok in recs:
        # hi spread over the index (its top half picks the home bucket)
        klo, khi = key if isinstance(key, tuple) else (key, (key * 0x9E3779B97F4A7C15) % (1 << 64))
        # extra digest: lo 2 asks daemon_frames' FRAME_FIX for the key the
        # parent and tokens make (the daemon refuses any other, issue #24)
        out += struct.pack("<IIQQQQQQ", page, gen, klo, khi, parent,
                           parent * 7 + 1 if parent else 0, 2, 0)
        out += struct.pack("<%dI" % bt, *range(tok, tok + bt))
    return out


def key_hi(k):
    """The high half pub() gives key lo (spread over the index)."""
    return (k * 0x9E3779B97F4A7C15) % (1 << 64)


def alloc_keys(recs, flags=0):
    """ALLOC_KEYS claiming the blocks of chain() records: (key, parent)."""
    out = struct.pack("<II", len(recs), flags)
    for _page, _gen, key, parent, _tok in recs:
        out += struct.pack("<QQQQ", key, key_hi(key), parent, parent * 7 + 1 if parent else 0)
    return out


def alloc_real_keys(recs, flags=0):
    """ALLOC_KEYS claiming the blocks of chain() records under the keys
    their PUBLISH records get from FRAME_FIX (key lo 3, hi the first token:
    daemon_frames' fix_claim_key), so that a rank can publish what it
    claimed: for ranks writing slices of one page."""
    out = struct.pack("<II", len(recs), flags)
    for _page, _gen, _key, parent, tok in recs:
        out += struct.pack("<QQQQ", 3, tok, parent, parent * 7 + 1 if parent else 0)
    return out


def keys(ks):
    return struct.pack("<II", len(ks), 0) + b"".join(
        struct.pack("<QQ", k, (k * 0x9E3779B97F4A7C15) % (1 << 64)) for k in ks)


def stat(version=VERSION, flags=0):
    """STAT, and DROP and RESET, which have the same shape."""
    return struct.pack("<II", version, flags)


def admin(op, ns_row=ANY, ttl=0, pin_id=0, tokens=(), model=b"", tenant=b"", label=b"",
          version=VERSION):
    """struct kvproto_admin, then its tokens."""
    return struct.pack("<6I", version, op, ns_row, ttl, pin_id, len(tokens)) + \
        model.ljust(64, b"\0")[:64] + tenant.ljust(32, b"\0")[:32] + \
        label.ljust(24, b"\0")[:24] + struct.pack("<%dI" % len(tokens), *tokens)


def pin(ks, ttl=60, flags=0, label=b""):
    """struct kvproto_pin, then its keys (lo; hi spread as keys() does)."""
    return struct.pack("<4I", len(ks), ttl, flags, 0) + label.ljust(24, b"\0")[:24] + \
        b"".join(struct.pack("<QQ", k, (k * 0x9E3779B97F4A7C15) % (1 << 64)) for k in ks)


def write(target, name, data, kind="corpus"):
    d = os.path.join(HERE, kind, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def chain(n, base=0x1000, tok=0):
    """n publish records on pages 0..n-1 at gen 1, keys chained."""
    recs, parent = [], 0
    for i in range(n):
        key = base + i
        recs.append((i, 1, key, parent, tok + 16 * i))
        parent = key
    return recs


# ------------------------------------------------------------------ proto
def proto_seeds():
    bt16 = struct.pack("<H", 16)
    write("proto", "hello", bt16 + frame(HELLO, hello()))
    write("proto", "alloc", bt16 + frame(ALLOC, alloc(4)))
    write("proto", "publish", bt16 + frame(PUBLISH, pub(chain(2))))
    write("proto", "free", bt16 + frame(FREE, pgs([(0, 1), (1, 1)])))
    write("proto", "stat", bt16 + frame(STAT, stat()))
    write("proto", "bye", bt16 + frame(BYE))
    write("proto", "restore", bt16 + frame(RESTORE, keys([0x1000, 0x1001])) +
          frame(RESTORE_R, struct.pack("<II", 2, 0) + struct.pack("<ii", 0, -2)))
    write("proto", "replies", bt16 +
          frame(HELLO_R, bytes(64)) +
          frame(ALLOC_R, pgs([])) +
          frame(ALLOC_R, pgs([(0, 1), (1, 1)])) +
          frame(PUBLISH_R, struct.pack("<II", 1, 0) + struct.pack("<iIII", 0, 0, 1, 0)) +
          frame(FREE_R, struct.pack("<II", 2, 0)) +
          frame(ERROR, struct.pack("<iI", -71, 1) + b"expected HELLO first") +
          frame(STAT_R, struct.pack("<IIQ", 1, 2, 1 << 20)))
    write("proto", "session", bt16 + frame(HELLO, hello()) + frame(ALLOC, alloc(2), 2) +
          frame(PUBLISH, pub(chain(2)), 3) + frame(FREE, pgs([(0, 3)]), 4) + frame(BYE))
    write("proto", "alloc-keys", bt16 + frame(ALLOC_KEYS, alloc_keys(chain(3), ALLOC_SINGLE)) +
          frame(ALLOC_KEYS, alloc_keys(chain(1))) +
          frame(ERROR, struct.pack("<iI", -115, 0) + b"the first block is being written"))
    write("proto", "publish-bt1", struct.pack("<H", 1) + frame(PUBLISH, pub(chain(3), 1)))
    write("proto", "publish-no-ns", struct.pack("<H", 0) + frame(PUBLISH, pub(chain(1))))
    write("proto", "bad-magic", bt16 + frame(ALLOC, alloc(1), magic=0x12345678))
    write("proto", "too-long", bt16 + frame(ALLOC, alloc(1), length=(16 << 20) + 1))
    write("proto", "count-mismatch", bt16 + frame(FREE, struct.pack("<II", 3, 0) + bytes(16)))
    write("proto", "hello-bad-geometry", bt16 + frame(HELLO, hello(dtype=3, layers=0)))
    # Engine-keyed namespaces (KVPROTO_HELLO_ENGINE_KEYS), and a flag no
    # HELLO may carry.
    write("proto", "hello-engine-keys", bt16 + frame(HELLO, hello(flags=1)))
    write("proto", "hello-bad-flags", bt16 + frame(HELLO, hello(flags=8)))
    # Tensor-parallel ranks and MLA (issue #33): rank 1 of 2 over 2 heads,
    # an MLA latent (one KV head), a split no rank can make, and a
    # PUBLISH_R of a slice (status 2) and of a page given up (-ESTALE).
    write("proto", "hello-tp", bt16 + frame(HELLO, hello(kv=2, shard=(1, 2, 0, 0))))
    write("proto", "hello-mla", bt16 + frame(HELLO, hello(flags=4, shard=(3, 4, 0, 0))))
    write("proto", "hello-bad-split", bt16 + frame(HELLO, hello(kv=3, shard=(0, 2, 0, 0))))
    write("proto", "publish-slice-replies", bt16 +
          frame(PUBLISH_R, struct.pack("<II", 2, 0) + struct.pack("<iIII", 2, 5, 1, 0) +
                struct.pack("<iIII", -116, 0, 0, 0)))
    # cuda pool hand-over: POOL, and POOL_R with 3 chunks of 4 MiB at 2 MiB
    # granularity holding a 10 MiB pool.
    write("proto", "pool", bt16 + frame(POOL, struct.pack("<II", 1, 0)) +
          frame(POOL_R, struct.pack("<IIQQQ16siI", 1, 3, 4 << 20, 2 << 20, 10 << 20,
                                    bytes(range(16)), 0, 0)))
    # Dropping a namespace and resetting the statistics, with replies;
    # then one with flags set and one a byte short.
    # An operator's requests and their replies; pins and unpins of a
    # client; then broken ones: an unknown op, tokens for a drop, a name
    # not NUL-terminated, a pin of no keys, a TTL over 30 days, flags.
    write("proto", "admin-pin", bt16 + frame(ADMIN, admin(A_PIN, ttl=60, tokens=range(40),
                                                         model=b"llama-3-8b")) +
          frame(ADMIN_R, struct.pack("<8I", VERSION, A_PIN, 0, 0, 0, 1, 2, 2)) +
          frame(ADMIN, admin(A_DROP_TENANT, tenant=b"acme")) +
          frame(ADMIN, admin(A_DROP_NS, model=b"m")) + frame(ADMIN, admin(A_UNPIN, pin_id=3)) +
          frame(PIN, pin([1, 2, 3])) + frame(PIN_R, struct.pack("<4I", 1, 3, 3, 0)) +
          frame(UNPIN, struct.pack("<II", 1, 0)) + frame(UNPIN_R, struct.pack("<II", 1, 0)))
    write("proto", "admin-bad", bt16 + frame(ADMIN, admin(9)) +
          frame(ADMIN, admin(A_DROP_NS, tokens=[1])) +
          frame(ADMIN, admin(A_DROP_NS)[:-1] + b"x") + frame(ADMIN, admin(A_PIN, ttl=0, tokens=[1])) +
          frame(PIN, pin([])) + frame(PIN, pin([1], ttl=31 * 86400)) +
          frame(PIN, pin([1], flags=2)) + frame(UNPIN, struct.pack("<II", 1, 1)))
    write("proto", "drop-reset", bt16 + frame(DROP, stat()) +
          frame(DROP_R, struct.pack("<4I", 12, 1, 3, 0)) + frame(RESET, stat()) +
          frame(RESET_R, struct.pack("<II", 2, 0)) + frame(DROP, stat(flags=1)) +
          frame(RESET, stat()[:7]))


# ---------------------------------------------------------- daemon_frames
TP0, TP1 = (0, 2, 0, 0), (1, 2, 0, 0)
OP_FRAME, OP_FIX, OP_TICK, OP_HANGUP, OP_PIN, OP_LEDGER = 0, 7, 9, 10, 11, 12
OP_TOUCH, OP_HIT, OP_EXIT = 13, 14, 15


def op(kind, row=0, linger=False):
    return bytes([kind | row << 4 | (0x40 if linger else 0)])


def f(typ, payload=b"", row=0, seq=1, fix=False, linger=False, **kw):
    return op(OP_FIX if fix else OP_FRAME, row, linger) + frame(typ, payload, seq, **kw)


def tp_seeds(bt16):
    """Tensor-parallel ranks writing slices of one page (issue #33)."""
    c = chain(3)
    # Rank 0 of 2 begins three pages, rank 1 joins them, both publish:
    # each page READY at its last slice. Then the unsharded model hits.
    two = bt16 + f(HELLO, hello(kv=2, shard=TP0)) + \
        f(ALLOC_KEYS, alloc_real_keys(c), seq=2, fix=True)
    two += f(HELLO, hello(kv=2, shard=TP1, name=b"rank1"), row=1) + \
        f(ALLOC_KEYS, alloc_real_keys(c), row=1, seq=2, fix=True)
    two += f(PUBLISH, pub(c), seq=3, fix=True) + f(PUBLISH, pub(c), row=1, seq=3, fix=True)
    two += op(OP_TICK) + f(HELLO, hello(kv=2, name=b"tp1"), row=2) + f(BYE) + \
        f(BYE, row=1) + f(BYE, row=2)
    write("daemon_frames", "tp-slices", two)
    # Rank 1 frees its slices unwritten: the pages are given up once rank
    # 0's publish of them is answered (-ESTALE).
    fr = bt16 + f(HELLO, hello(kv=2, shard=TP0)) + \
        f(ALLOC_KEYS, alloc_real_keys(c), seq=2, fix=True)
    fr += f(HELLO, hello(kv=2, shard=TP1, name=b"rank1"), row=1) + \
        f(ALLOC_KEYS, alloc_real_keys(c), row=1, seq=2, fix=True)
    fr += f(FREE, pgs([(0, 0), (1, 0), (2, 0)]), row=1, seq=3, fix=True) + \
        f(PUBLISH, pub(c), seq=3, fix=True) + op(OP_TICK)
    write("daemon_frames", "tp-slice-freed", fr)
    # Rank 0 alone: its slices in, rank 1 never comes (given up at the
    # tick); rank 1 hangs up holding its slices in another run.
    to = bt16 + f(HELLO, hello(kv=2, shard=TP0)) + \
        f(ALLOC_KEYS, alloc_real_keys(c), seq=2, fix=True) + \
        f(PUBLISH, pub(c), seq=3, fix=True) + op(OP_TICK)
    write("daemon_frames", "tp-slice-timeout", to)
    hu = bt16 + f(HELLO, hello(kv=2, shard=TP0)) + \
        f(ALLOC_KEYS, alloc_real_keys(c), seq=2, fix=True)
    hu += f(HELLO, hello(kv=2, shard=TP1, name=b"rank1"), row=1, linger=True) + \
        f(ALLOC_KEYS, alloc_real_keys(c), row=1, seq=2, fix=True) + op(OP_HANGUP, row=1) + \
        f(PUBLISH, pub(c), seq=3, fix=True) + op(OP_EXIT, row=1) + op(OP_TICK)
    write("daemon_frames", "tp-rank-exits", hu)
    # A replica rank (2 heads at TP 4, rank 1) and an MLA rank 1 ask for
    # pages: refused, not dropped; a plain ALLOC of a slicing rank too.
    rep = bt16 + f(HELLO, hello(kv=2, shard=(1, 4, 0, 0))) + f(ALLOC_KEYS, alloc_keys(c), seq=2)
    rep += f(HELLO, hello(flags=4, shard=(1, 4, 0, 0), name=b"mla1"), row=1) + \
        f(ALLOC, alloc(2), row=1, seq=2)
    rep += f(HELLO, hello(kv=2, shard=TP0, name=b"rank0"), row=2) + f(ALLOC, alloc(2), row=2, seq=2)
    rep += f(HELLO, hello(flags=4, shard=(0, 4, 0, 0), name=b"mla0"), row=3) + \
        f(ALLOC_KEYS, alloc_real_keys(c), row=3, seq=2, fix=True) + \
        f(PUBLISH, pub(c), row=3, seq=3, fix=True)
    write("daemon_frames", "tp-replicas-and-mla", rep)


def daemon_seeds():
    bt16 = b"\x00"
    h = f(HELLO, hello())
    write("daemon_frames", "hello", bt16 + h)
    write("daemon_frames", "hello-alloc-publish", bt16 + h + f(ALLOC, alloc(4), seq=2) +
          f(PUBLISH, pub(chain(4)), seq=3, fix=True) + f(BYE))
    write("daemon_frames", "alloc-free", bt16 + h + f(ALLOC, alloc(8), seq=2) +
          f(FREE, pgs([(i, 0) for i in range(8)]), seq=3, fix=True) + f(BYE))
    write("daemon_frames", "stat", bt16 + f(STAT, stat()))
    # An engine-keyed and a token-keyed namespace of one model, each
    # publishing: two rows, two roots; then a HELLO with an unknown flag.
    eng = bt16 + f(HELLO, hello(flags=1)) + f(ALLOC, alloc(3), seq=2) + \
        f(PUBLISH, pub(chain(3)), seq=3, fix=True)
    eng += f(HELLO, hello(name=b"second"), row=1) + f(ALLOC, alloc(3), row=1, seq=2) + \
        f(PUBLISH, pub(chain(3)), row=1, seq=3, fix=True) + op(OP_TICK)
    eng += f(HELLO, hello(name=b"third", flags=8), row=2)
    write("daemon_frames", "engine-keys-and-tokens", eng)
    tp_seeds(bt16)
    # RESTORE with no spill tier: every key is simply not spilled.
    write("daemon_frames", "restore", bt16 + h + f(ALLOC, alloc(2), seq=2) +
          f(PUBLISH, pub(chain(2)), seq=3, fix=True) +
          f(RESTORE, keys([0x1000, 0x1001, 0x2000]), seq=4) + f(BYE))
    # POOL to a host pool: refused (its fd came with HELLO).
    write("daemon_frames", "hello-pool", bt16 + h + f(POOL, struct.pack("<II", VERSION, 0), seq=2))
    write("daemon_frames", "stat-bad-version", bt16 + f(STAT, stat(version=9)))
    write("daemon_frames", "linger-exit", bt16 + f(HELLO, hello(), linger=True) +
          f(ALLOC, alloc(2), seq=2) + op(OP_HANGUP) + op(OP_TICK) + op(OP_EXIT))
    # Two clients publish the same chain (dup) and a colliding block.
    two = bt16 + h + f(ALLOC, alloc(3), seq=2) + f(PUBLISH, pub(chain(3)), seq=3, fix=True)
    two += f(HELLO, hello(name=b"second"), row=1) + f(ALLOC, alloc(3), row=1, seq=2)
    two += f(PUBLISH, pub(chain(2) + [(2, 1, 0x1000, 0, 999)]), row=1, seq=3, fix=True)
    write("daemon_frames", "two-clients-dup-collision", two)
    # Fill the pool, then a second client's ALLOC makes the daemon evict.
    full = bt16 + h + f(ALLOC, alloc(48), seq=2) + \
        f(PUBLISH, pub(chain(48)), seq=3, fix=True) + op(OP_TICK) * 2
    full += f(HELLO, hello(name=b"second"), row=1) + f(ALLOC, alloc(40), row=1, seq=2)
    write("daemon_frames", "fill-evict", full)
    # The same with the spill tier on (first byte bit 2): evicted pages
    # spill; the first client then restores spilled blocks (FIX points the
    # keys at spilled ones), and publishes a spilled block again.
    sp = b"\x04" + full[1:] + op(OP_TICK) * 2
    sp += f(RESTORE, keys([0, 1, 2, 3, 4, 5, 6, 7]), seq=4, fix=True)
    sp += f(ALLOC, alloc(4), seq=5) + f(PUBLISH, pub(chain(4)), seq=6, fix=True)
    sp += f(RESTORE, keys([8, 9]), seq=7, fix=True) + op(OP_TICK) * 3
    write("daemon_frames", "spill-restore", sp)
    write("daemon_frames", "spill-hello-alloc-publish", b"\x04" + h + f(ALLOC, alloc(4), seq=2) +
          f(PUBLISH, pub(chain(4)), seq=3, fix=True) + f(BYE))
    # Pins hold pages through eviction.
    pins = bt16 + h + f(ALLOC, alloc(40), seq=2) + f(PUBLISH, pub(chain(40)), seq=3, fix=True)
    pins += op(OP_PIN) + struct.pack("<HBB", 0, 0, 0) + op(OP_PIN) + struct.pack("<HBB", 1, 1, 0)
    pins += f(HELLO, hello(name=b"second"), row=1) + f(ALLOC, alloc(40), row=1, seq=2)
    pins += op(OP_TICK) * 6
    write("daemon_frames", "pins-evict", pins)
    # The client writes its ledger: hits, accesses, raw bytes.
    led = bt16 + h + f(ALLOC, alloc(2), seq=2) + f(PUBLISH, pub(chain(2)), seq=3, fix=True)
    led += op(OP_HIT) + struct.pack("<HIB", 0x1000, 32, 13) + b"system-prompt"
    led += op(OP_HIT) + struct.pack("<HIB", 0x1001, 1 << 23, 24) + b"\x01" * 24
    led += op(OP_TOUCH) + b"\x01" + op(OP_TOUCH) + b"\xf0"
    # Ring runs (layout 17): down from page 48, past page 0, malformed.
    led += op(OP_TOUCH) + b"\x30" + op(OP_TOUCH) + b"\xc5" + op(OP_TOUCH) + b"\x02"
    led += op(OP_TOUCH) + b"\xc5" + op(OP_TOUCH) + b"\xff"
    led += op(OP_LEDGER) + struct.pack("<HB", 128, 8) + struct.pack("<Q", 1 << 40)
    led += op(OP_TICK) * 6
    write("daemon_frames", "ledger-writes", led)
    # Everything WRITING: the pool runs dry and eviction finds nothing.
    dry = bt16 + h + f(ALLOC, alloc(48), seq=2) + f(HELLO, hello(name=b"second"), row=1)
    dry += f(ALLOC, alloc(16), row=1, seq=2) + f(ALLOC, alloc(8), row=1, seq=3) + op(OP_TICK) * 3
    write("daemon_frames", "pool-dry", dry)
    # Accessed pages get a second chance from the CLOCK.
    acc = bt16 + h + f(ALLOC, alloc(40), seq=2) + f(PUBLISH, pub(chain(40)), seq=3, fix=True)
    acc += op(OP_TICK) + b"".join(op(OP_TOUCH) + bytes([i]) for i in range(8))
    acc += f(HELLO, hello(name=b"second"), row=1) + f(ALLOC, alloc(30), row=1, seq=2) + op(OP_TICK)
    write("daemon_frames", "touch-evict", acc)
    # More distinct prefix roots than the top sketch holds (32).
    top = bt16 + h + b"".join(op(OP_HIT) + struct.pack("<HIB", 0x100 + i, 16 + i, 3) + b"abc"
                              for i in range(34)) + op(OP_TICK)
    write("daemon_frames", "top-full", top)
    # Namespace table full (3 rows in the target) of models with clients.
    nsf = bt16
    for i in range(4):
        nsf += f(HELLO, hello(model=b"model-%d" % i), row=i)
    write("daemon_frames", "namespace-full", nsf)
    # Entries living away from their home bucket get evicted (spill hints).
    win = bt16 + h + f(ALLOC, alloc(30), seq=2)
    win += f(PUBLISH, pub([(i, 1, (i + 1, 7 << 32), 0, i) for i in range(30)]), seq=3, fix=True)
    win += f(HELLO, hello(name=b"second"), row=1) + f(ALLOC, alloc(40), row=1, seq=2)
    win += f(PUBLISH, pub([(i, 1, (0x100 + i, 7 << 32), 0, i) for i in range(10)]), row=1,
             seq=3, fix=True)
    write("daemon_frames", "index-window-evict", win)
    # Every READY page pinned: eviction backs off until pins are released.
    bo = bt16 + h + f(ALLOC, alloc(40), seq=2) + f(PUBLISH, pub(chain(40)), seq=3, fix=True)
    bo += b"".join(op(OP_PIN) + struct.pack("<HBB", i, i, 0) for i in range(40))
    bo += f(HELLO, hello(name=b"second"), row=1) + f(ALLOC, alloc(24), row=1, seq=2)
    bo += b"".join(op(OP_PIN) + struct.pack("<HBB", i, i, 0xff) for i in range(20))
    bo += op(OP_TICK) * 6 + f(ALLOC, alloc(20), row=1, seq=3)
    write("daemon_frames", "evict-backoff-unpin", bo)
    # A client rewinds its hit ring (the daemon must not trust hit_head).
    hr = bt16 + h + b"".join(op(OP_HIT) + struct.pack("<HIB", 0x200 + i, 16, 0) for i in range(3))
    hr += op(OP_TICK) + op(OP_LEDGER) + struct.pack("<HB", 1216, 8) + struct.pack("<Q", 1)
    hr += op(OP_TICK) + op(OP_LEDGER) + struct.pack("<HB", 1216, 8) + struct.pack("<Q", 1 << 63)
    hr += op(OP_TICK)
    write("daemon_frames", "hit-ring-rewind", hr)
    # More models than namespace rows (3 in the target): rows are reused.
    ns = bt16
    for i in range(6):
        ns += f(HELLO, hello(model=b"model-%d" % i)) + f(ALLOC, alloc(1), seq=2) + \
            f(PUBLISH, pub([(0, 1, 0x5000 + i, 0, i)]), seq=3, fix=True) + f(BYE, seq=4)
    write("daemon_frames", "namespace-reuse", ns)
    # Protocol violations, each on a fresh connection.
    bad = bt16 + f(ALLOC, alloc(1)) + f(HELLO, hello()) + f(HELLO, hello(), seq=2)
    bad += f(HELLO, hello()) + f(PUBLISH, pub(chain(1))[:-4], seq=2)
    bad += f(HELLO, hello(bt=32)) + f(HELLO, hello(hd=4096))
    bad += f(ALLOC, alloc(1), magic=0xdeadbeef) + f(HELLO, hello(version=VERSION + 1))
    bad += f(HELLO, hello()) + f(FREE, pgs([(0, 1)]), seq=2) + f(HELLO, hello()) + f(HELLO_R, bytes(64))
    write("daemon_frames", "violations", bad)
    write("daemon_frames", "bt1024", b"\x03" + f(HELLO, hello(bt=1024, hd=1, dtype=1)) +
          f(ALLOC, alloc(2), seq=2) + f(PUBLISH, pub(chain(2), 1024), seq=3, fix=True))
    # A client drops its namespace while another pins part of it: the
    # second DROP in the same tick is refused (-EAGAIN), the one after a
    # tick goes through; with the spill tier on, slots are dropped too.
    dr = bt16 + h + f(ALLOC, alloc(8), seq=2) + f(PUBLISH, pub(chain(8)), seq=3, fix=True)
    dr += f(HELLO, hello(name=b"second"), row=1)
    dr += op(OP_PIN, 1) + struct.pack("<HBB", 0, 0, 0)
    dr += f(DROP, stat(), seq=4) + f(DROP, stat(), seq=5) + op(OP_TICK)
    dr += f(DROP, stat(), seq=6) + f(DROP, stat(), row=1, seq=2) + op(OP_TICK)
    write("daemon_frames", "drop", dr)
    write("daemon_frames", "spill-drop", b"\x04" + full[1:] + op(OP_TICK) * 2 +
          f(DROP, stat(), seq=4) + op(OP_TICK) + f(HELLO, hello(name=b"third"), row=2) +
          f(RESTORE, keys([0, 1]), row=2, seq=2, fix=True))
    # RESET from an observer in the middle of traffic, then more traffic:
    # counting starts again from zero; a RESET of another protocol
    # version, and one after HELLO (not an observer's), are refused.
    rs = bt16 + h + f(ALLOC, alloc(4), seq=2) + f(PUBLISH, pub(chain(4)), seq=3, fix=True)
    rs += op(OP_HIT) + struct.pack("<HIB", 0x1000, 64, 3) + b"doc" + op(OP_TICK)
    rs += f(RESET, stat(), row=1) + op(OP_TICK)
    rs += f(ALLOC, alloc(2), seq=4) + f(FREE, pgs([(4, 0), (5, 0)]), seq=5, fix=True)
    rs += f(RESET, stat(version=9), row=2) + f(RESET, stat(), seq=6) + op(OP_TICK)
    write("daemon_frames", "reset", rs)
    # Single flight: the first client announces a chain; the second is
    # refused (single) and then granted unannounced pages for it; the first
    # publishes (its entries stay), the second's publish is a duplicate.
    sf = bt16 + h + f(ALLOC_KEYS, alloc_keys(chain(4)), seq=2)
    sf += f(HELLO, hello(name=b"second"), row=1)
    sf += f(ALLOC_KEYS, alloc_keys(chain(4), ALLOC_SINGLE), row=1, seq=2)
    sf += f(ALLOC_KEYS, alloc_keys(chain(4)), row=1, seq=3)
    sf += f(PUBLISH, pub(chain(4)), seq=3, fix=True) + op(OP_TICK)
    sf += f(PUBLISH, pub(chain(4)), row=1, seq=4, fix=True) + f(BYE, seq=4) + f(BYE, row=1, seq=5)
    write("daemon_frames", "single-flight", sf)
    # The second client publishes first and takes the announcements over;
    # an announced page freed, and one whose writer hangs up.
    to = bt16 + h + f(ALLOC_KEYS, alloc_keys(chain(4)), seq=2)
    to += f(HELLO, hello(name=b"second"), row=1) + f(ALLOC, alloc(4), row=1, seq=2)
    to += f(PUBLISH, pub(chain(4)), row=1, seq=3, fix=True)
    to += f(PUBLISH, pub(chain(2)), seq=3, fix=True) + f(FREE, pgs([(2, 1), (3, 1)]), seq=4, fix=True)
    to += f(ALLOC_KEYS, alloc_keys(chain(3, base=0x3000)), seq=5) + op(OP_HANGUP) + op(OP_TICK)
    write("daemon_frames", "single-flight-takeover", to)
    # Tenants (issue #35): the configured tenant "fz" (salt fz, 40% of 64
    # pages) fills its share and is refused; a no-insert client is refused;
    # an unsalted client of another model goes on.
    tq = bt16 + f(HELLO, hello(salt=b"fz")) + f(ALLOC, alloc(30), seq=2)
    tq += f(PUBLISH, pub(chain(20)), seq=3, fix=True) + f(ALLOC, alloc(8), seq=4)
    tq += f(HELLO, hello(flags=2), row=1) + f(ALLOC, alloc(2), row=1, seq=2)
    tq += f(HELLO, hello(model=b"other", share=10), row=2) + f(ALLOC, alloc(8), row=2, seq=2)
    tq += op(OP_TICK) * 6 + f(ALLOC, alloc(8), seq=5)
    write("daemon_frames", "tenant-quota", tq)
    # A client pins a chain it published (FIX makes its keys the chain),
    # again (the same pin), unpins it, pins for one second; the pool fills
    # around the pinned pages.
    pn = bt16 + h + f(ALLOC, alloc(4), seq=2) + f(PUBLISH, pub(chain(4)), seq=3, fix=True)
    pn += f(PIN, pin([0, 0, 0, 0]), seq=4, fix=True) + f(PIN, pin([0, 0, 0, 0]), seq=5, fix=True)
    pn += f(UNPIN, struct.pack("<II", 1, 0), seq=6) + f(UNPIN, struct.pack("<II", 1, 0), seq=7)
    pn += f(PIN, pin([0, 0], ttl=1), seq=8, fix=True) + op(OP_TICK)
    pn += f(HELLO, hello(name=b"second"), row=1)
    for i in range(6):
        pn += f(ALLOC, alloc(10), row=1, seq=2 + 2 * i)
        pn += f(PUBLISH, pub(chain(10, base=0x4000 + 0x100 * i)), row=1, seq=3 + 2 * i, fix=True)
        pn += f(FREE, pgs([(0, 0)]), row=1, seq=30 + i) + op(OP_TICK)
    write("daemon_frames", "pin-client", pn)
    # An operator pins a cached chain from its tokens (FIX names the
    # namespace and copies the tokens), drops the tenant and the
    # namespace, unpins, and is refused an unknown name.
    ad = bt16 + h + f(ALLOC, alloc(4), seq=2) + f(PUBLISH, pub(chain(4)), seq=3, fix=True)
    ad += f(ADMIN, admin(A_PIN, ns_row=0, ttl=30, tokens=[0] * 64), row=1, fix=True)
    ad += f(ADMIN, admin(A_PIN, ns_row=0, ttl=30, tokens=[0] * 40, label=b"\x01"), row=2,
            fix=True)
    ad += op(OP_TICK) + f(ADMIN, admin(A_DROP_TENANT, ns_row=0, label=b"\x02"), row=1, fix=True)
    ad += f(ADMIN, admin(A_DROP_TENANT, ns_row=0), row=1, fix=True)
    ad += f(ADMIN, admin(A_DROP_NS, ns_row=0), row=2, fix=True)
    ad += f(ADMIN, admin(A_UNPIN, pin_id=1), row=3) + f(ADMIN, admin(A_DROP_TENANT, tenant=b"none"), row=3)
    ad += f(ALLOC, alloc(4), seq=4) + f(PUBLISH, pub(chain(4, tok=5)), seq=5, fix=True)
    write("daemon_frames", "admin", ad)
    write("daemon_frames", "index-window", bt16 + h + f(ALLOC, alloc(30), seq=2) +
          f(PUBLISH, pub([(i, 1, (i + 1, 7 << 32), 0, i) for i in range(30)]), seq=3,
            fix=True) + op(OP_TICK))


# ------------------------------------------------------------------ config
def config_seeds():
    with open(os.path.join(ROOT, "daemon", "kvcached.conf.example"), "rb") as fh:
        example = fh.read()
    write("config", "example", example)
    write("config", "example-gid0", re.sub(rb"allow-groups = kvcached", b"allow-groups = 0", example))
    full = b"""socket = /tmp/kvfuzz.sock
pool = host
pool-size = 64MiB
page-size = 2M
block-tokens = 16
max-clients = 8
max-per-process = 2
max-pins = 1024
low-watermark = 5
high-watermark = 10
socket-mode = 0600
hugepages = off
log-level = debug
tick-ms = 50
metrics-listen = 127.0.0.1:9464
foreground = yes
allow-users = 0, root
allow-groups = 0
"""
    write("config", "every-key", full)
    write("config", "ipv6-metrics", b"metrics-listen = [::1]:0\npool-size=1T\npage-size=1G\n")
    write("config", "bad-suffix", b"pool-size = 10X\n")
    write("config", "no-equals", b"# comment\n\npool-size 4G\n")
    write("config", "config-key", b"config = /etc/passwd\n")
    write("config", "unknown-key", b"pool-sise = 4G\n")
    write("config", "check-fails", b"page-size = 4097\nlow-watermark = 50\nhigh-watermark = 10\n")
    write("config", "long-line", b"socket = " + b"a" * 4200 + b"\n")
    write("config", "args", b"pool-size = 2G\n\0--config\0x\0--page-size\0 4K\0--foreground\0"
          b"--allow-users=0,1,2\0--metrics-listen=[::1]:9464\0--socket-mode\0700")
    write("config", "args-help", b"\0--pool=cuda\0--help")
    write("config", "args-version", b"\0--version")
    write("config", "args-bad", b"\0--block-tokens\0" b"1025\0--tick-ms=0\0stray")
    write("config", "size", b"512MiB")
    write("config", "listen", b"192.168.0.1:65535")
    write("config", "kv-events", b"kv-events = tcp://*:5557\nkv-events-replay = tcp://*:5558\n"
          b"kv-events-buffer = 100\nkv-events-topic = kv@{host}@{model}\n"
          b"kv-events-hash = int64\nkv-events-hwm = 64\nkv-events-stall-ms = 0\n"
          b"kv-events-mode = connect\nkv-events-format = array\n"
          b"kv-events-host-medium = CPU_PINNED\n")
    write("config", "kv-events-bad", b"kv-events = udp://x:1\nkv-events-topic = a {b}\n"
          b"kv-events-replay = ipc://\nkv-events-format = list\n"
          b"kv-events-host-medium = host memory\n")
    write("config", "args-kv-events", b"\0--kv-events\0ipc:///tmp/ev\0--kv-events-replay="
          b"ipc:///tmp/rp\0--kv-events-hash\0bytes\0--kv-events-topic={model}")
    write("config", "args-replay-alone", b"\0--kv-events-replay\0tcp://*:1")


# ------------------------------------------------------------ kv events
def ev_publish(ns, blocks, seed, chained=0):
    return bytes([0, ns, blocks - 1, seed, chained])


def ev_replay(frames, verdict=0, req=0):
    out = bytes([7, len(frames)])
    for fr in frames:
        out += bytes([len(fr)]) + (b"\x00" if len(fr) > 8 else b"") + fr
    return out + bytes([verdict, req])


EV_TICK = b"\x06"


def events_seeds():
    """tests/fuzz/events.c: a mode byte, then operations."""
    start0 = b"\x00" * 8
    write("events", "publish-tick", b"\x00" + ev_publish(0, 3, 1) + EV_TICK +
          ev_publish(0, 2, 2, 1) + EV_TICK)
    write("events", "evict", b"\x00" + ev_publish(0, 6, 1) + ev_publish(1, 6, 2) +
          ev_publish(2, 6, 3) + b"\x01\x07" + EV_TICK + b"\x01\x07")
    write("events", "spill-restore", b"\x00" + ev_publish(0, 4, 1) + EV_TICK +
          b"\x02\x00\x02\x01\x02\x02" + EV_TICK + b"\x03\x00\x04\x01" + EV_TICK)
    write("events", "clear", b"\x00" + ev_publish(0, 4, 1) + ev_publish(1, 2, 2) + EV_TICK +
          b"\x02\x00" + b"\x05\x00" + EV_TICK)
    write("events", "shared-topic-clear", b"\x04" + ev_publish(0, 4, 1) + ev_publish(1, 2, 2) +
          EV_TICK + b"\x05\x01" + EV_TICK)
    write("events", "muted-rank", b"\x00" + ev_publish(3, 4, 1) + ev_publish(0, 4, 1) + EV_TICK)
    write("events", "int64", b"\x02" + ev_publish(0, 6, 9) + EV_TICK)
    write("events", "bytes", b"\x03" + ev_publish(0, 6, 9) + b"\x02\x01" + EV_TICK)
    write("events", "replay", bytes([7 << 3]) + ev_publish(0, 2, 1) + EV_TICK +
          ev_publish(1, 2, 2) + EV_TICK + ev_publish(2, 2, 3) + EV_TICK +
          ev_replay([b"ab", b"", start0]) + ev_replay([b"ab", b"", start0], 1) +
          ev_replay([b"ab", b"", b"\x00" * 7 + b"\x01"], 2))
    write("events", "replay-bad", bytes([2 << 3]) + ev_publish(0, 2, 1) + EV_TICK +
          ev_replay([b"ab", b"x", start0]) + ev_replay([b"ab", b"", b"\x00" * 7]) +
          ev_replay([b"", b"", start0]) + ev_replay([b"ab", b""]) +
          ev_replay([b"ab", b"", start0, b"more"]))
    # Events as maps (mode bit 6): the same operations, the other encoding.
    write("events", "map-publish-evict", b"\x40" + ev_publish(0, 6, 1) + ev_publish(1, 6, 2) +
          ev_publish(2, 6, 3) + b"\x01\x07" + EV_TICK + b"\x02\x00" + b"\x01\x03" + EV_TICK)
    write("events", "map-clear", b"\x41" + ev_publish(0, 4, 1) + ev_publish(1, 2, 2) +
          EV_TICK + b"\x02\x00\x02\x01" + b"\x05\x00" + EV_TICK + ev_publish(0, 3, 4) +
          EV_TICK)
    # A REQ peer: one message per request, asking from the next each time.
    write("events", "replay-req", bytes([0x40 | 7 << 3]) + ev_publish(0, 2, 1) + EV_TICK +
          ev_publish(1, 2, 2) + EV_TICK + ev_replay([b"ab", b"", start0], 0, 1) +
          ev_replay([b"ab", b"", b"\x00" * 7 + b"\x01"], 0, 1) +
          ev_replay([b"ab", b"", b"\x00" * 7 + b"\x02"], 0, 1))


# ------------------------------------------------------------ remote tier
def fetch(ks, parent=0, bt=16, flags=0):
    """FETCH: parent, then each key with bt tokens."""
    out = struct.pack("<IIQQ", len(ks), flags, parent, 0)
    for i, k in enumerate(ks):
        out += struct.pack("<QQ", k, (k * 0x9E3779B97F4A7C15) % (1 << 64))
        out += struct.pack("<%dI" % bt, *range(16 * i, 16 * i + bt))
    return out


def remote_seeds():
    bt16 = struct.pack("<H", 16)
    write("proto", "fetch", bt16 + frame(FETCH, fetch([0x1000, 0x1001])) +
          frame(FETCH_R, struct.pack("<II2i", 2, 0, 0, -2)))
    write("proto", "fetch-bt1", struct.pack("<H", 1) + frame(FETCH, fetch([7, 8, 9], bt=1)))
    write("proto", "fetch-bad-flags", bt16 + frame(FETCH, fetch([1], flags=1)))
    write("proto", "fetch-short", bt16 + frame(FETCH, fetch([1, 2])[:-4]))
    # daemon_frames: FETCH with no remote tier (keys published, unknown,
    # and, with the spill tier on, spilled ones: FIX points them there).
    h = f(HELLO, hello())
    write("daemon_frames", "fetch", b"\x00" + h + f(ALLOC, alloc(2), seq=2) +
          f(PUBLISH, pub(chain(2)), seq=3, fix=True) +
          f(FETCH, fetch([0x1000, 0x1001, 0x2000]), seq=4) + f(BYE))
    full = b"\x04" + h + f(ALLOC, alloc(48), seq=2) + \
        f(PUBLISH, pub(chain(48)), seq=3, fix=True) + op(OP_TICK) * 2
    full += f(HELLO, hello(name=b"second"), row=1) + f(ALLOC, alloc(40), row=1, seq=2)
    full += op(OP_TICK) * 2 + f(FETCH, fetch(list(range(8))), seq=4, fix=True)
    write("daemon_frames", "spill-fetch", full)
    # The same for an engine-keyed namespace (SGLang's): its FETCH does
    # not chain the blocks, each one's parent is the root the frame names.
    eng = b"\x04" + f(HELLO, hello(flags=1)) + full[1 + len(h):]
    write("daemon_frames", "spill-fetch-engine-keys", eng)
    # remote_val: byte 0 mode, byte 1 block tokens - 1, byte 2 secret.
    write("remote_val", "raw-empty", b"\x00\x0f\x01")
    write("remote_val", "raw-magic", b"\x00\x00\x01" + struct.pack("<QII", 0x31544F4D4552564B, 1, 1))
    # An item header of format 2 (nonce after the payload length), short.
    write("remote_val", "raw-v2", b"\x00\x00\x01" + struct.pack("<QII", 0x31544F4D4552564B, 2, 1) +
          bytes(40) + bytes(range(24)) + bytes(200))
    write("remote_val", "built", b"\x01\x03\x01" + bytes(range(256)) * 4)
    write("remote_val", "built-damaged", b"\x01\x00\x02" + bytes(range(64)) + b"\x05\x00\xff")
    write("remote_val", "built-insecure", b"\x01\x0f\x00" + bytes(200))
    write("remote_val", "servers", b"\x02\x00\x00memcached:10.0.0.1:11211,[::1]:11212,/run/mc.sock,cache-3.example:1")
    write("remote_val", "servers-bad", b"\x02\x00\x00memcached:a:0,b")
    write("remote_val", "replies", b"\x03\x00\x00VALUE kvc:0011:aabb 0 2097412\r\n"
          b"VALUE k 0 5 77\r\nEND\r\nSTORED\r\nNOT_STORED\r\n"
          b"SERVER_ERROR object too large for cache\r\n"
          b"SERVER_ERROR out of memory storing object\r\nCLIENT_ERROR bad\r\nERROR\r\n")
    write("remote_val", "replies-bad", b"\x03\x00\x00VALUE  0 1\r\nVALUE k -1 5\r\n"
          b"VALUE k 0 99999999999999999999999\r\nVALUE k\x01 0 1\r\nEND \r\n")
    # config: every remote key, and the flag form of remote-insecure.
    write("config", "remote", b"remote = memcached:127.0.0.1:11211,127.0.0.1:11212\n"
          b"remote-write = evict\nremote-secret-file = /etc/kvcached/secret\n"
          b"remote-insecure = no\nremote-timeout-ms = 250\nremote-prefix = fleet-1\n")
    write("config", "remote-args", b"remote = memcached:[::1]:1\n\0--config\0x\0"
          b"--remote-insecure\0--remote-write\0publish\0--remote-prefix=a.b_c")
    write("config", "remote-bad", b"remote = redis:1.2.3.4:6379\nremote-timeout-ms = 0\n")
    write("config", "remote-no-secret", b"remote = memcached:h:1\n")


# ------------------------------------------------------ regression inputs
def regress_inputs():
    """Inputs that once broke a promise; every run replays them."""
    # /metrics must stay valid UTF-8 (a scraper refuses the whole page
    # otherwise): a process name cut mid-character at 15 bytes, as the
    # kernel's comm and the daemon's copy of HELLO's name both cut it, and
    # a model name in Latin-1.
    cut = "kv推理服务器".encode()[:16]
    write("daemon_frames", "metrics-utf8-process-name",
          b"\x00" + f(HELLO, hello(name=cut)) + op(OP_TICK), "regress")
    write("daemon_frames", "metrics-utf8-model-name",
          b"\x00" + f(HELLO, hello(model="café".encode("latin-1"))) + op(OP_TICK), "regress")
    # A flag's value that reads "--config=..." is that flag's value, not a
    # config file (the round trip writes socket as "--socket" "--config=").
    write("config", "args-config-as-value", b"socket = --config=", "regress")
    # Namespaces that share one topic share one queue of events: a block
    # removed in one and the same hash stored in another reach subscribers
    # in the order they happened (one queue per namespace row sent the
    # store first, then the removal).
    write("events", "shared-topic-order", bytes.fromhex(
        "7f36000000000000151515152f1515151500000000000000051515151515151515151526151515150000f0010112668d15151502000605010100000000030006"), "regress")


if __name__ == "__main__":
    regress_inputs()
    proto_seeds()
    daemon_seeds()
    config_seeds()
    events_seeds()
    remote_seeds()
