/* SPDX-License-Identifier: MIT */
/*
 * settings.h - what the settings are (struct kvd_config), as every floor
 * of the daemon reads them. Filling them in (defaults, the config file,
 * the flags, a reload) is config.c's, on the top floor (config.h).
 */
#ifndef KVD_SETTINGS_H
#define KVD_SETTINGS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#define KVD_MAX_ALLOW 32

enum kvd_hugepages { KVD_HUGE_AUTO, KVD_HUGE_ON, KVD_HUGE_OFF };

/* How clients' pins are ordered against the evictor (shm/ledger.h):
 * membarrier(2) where the kernel has it, else a fence in every lookup;
 * or always the fence. */
enum kvd_pin_barrier { KVD_PIN_BARRIER_AUTO, KVD_PIN_BARRIER_FENCE };

/* How KV events write a block hash (docs/EVENTS.md). */
enum kvd_events_hash {
	KVD_EVENTS_HASH_UINT64,		/* vLLM's int form: 0 .. 2^64-1 */
	KVD_EVENTS_HASH_INT64,		/* the same bits as a signed 64-bit int */
	KVD_EVENTS_HASH_BYTES,		/* the 16-byte key, big-endian */
};

/* How KV events encode each event (docs/EVENTS.md). */
enum kvd_events_format {
	KVD_EVENTS_FORMAT_ARRAY,	/* vLLM <= 0.23: ["BlockStored", hashes, ...] */
	KVD_EVENTS_FORMAT_MAP,		/* vLLM >= 0.24: {"type": "BlockStored", ...} */
};

#define KVD_ENDPOINT 256		/* ZMQ endpoint bytes, NUL included */
#define KVD_MAX_TENANTS 32		/* `tenant` lines a config may have */
#define KVD_TENANT_NAME 32		/* name bytes, NUL included (KVSHM_TENANT_NAME) */
#define KVD_TENANT_SALT 256		/* salt bytes (KVPROTO_MAX_SALT) */

/* One `tenant` line: the clients of a salt, by the operator's name. */
struct kvd_tenant_cfg {
	char name[KVD_TENANT_NAME];	/* 1..31 of [A-Za-z0-9._-] */
	uint8_t salt[KVD_TENANT_SALT];
	uint32_t salt_len;		/* 0: the unsalted clients */
	uint32_t share;			/* percent of the pool; 0: tenant-share */
	bool no_insert;			/* its clients read and never publish */
	char where[96];			/* its line ("FILE:LINE"), "--" for a flag */
};

#define KVD_CONFIG_MAX_KEYS 64		/* rows of config.c's options[], at most */

/*
 * Where a setting's value came from, as kvd_config_set was told (`where`
 * "default" or "FILE:LINE"; "--" for a flag; "" if never set), and the
 * value as written
 * ("6K", not 6144), so that a message after the parse names them too
 * (kvd_config_where). Cut to the field; written by kvd_config_set only.
 */
struct kvd_config_src {
	char where[160];
	char text[48];
};
#define KVD_TOPIC 128			/* topic template bytes, NUL included */
#define KVD_MEDIUM 16			/* a medium name's bytes, NUL included */

struct kvd_config {
	char socket[108];
	char pool[8];			/* "host" or "cuda" */
	uint32_t gpu;			/* cuda pool: device ordinal */
	uint64_t pool_size;		/* bytes (resolved from pool_share) */
	uint32_t pool_share;		/* pool-size given as PCT%: 1..100, or 0 */
	uint32_t max_announced;		/* blocks one client may hold announced
					 * in flight (single flight) */
	uint32_t max_share;		/* percent of the pool one process may
					 * pin or hold writing */
	uint32_t tenant_share;		/* ... one tenant (salt), over its processes */
	uint32_t namespace_share;	/* ... one namespace (model), over its clients */
	struct kvd_tenant_cfg tenants[KVD_MAX_TENANTS];
	uint32_t n_tenants;
	uint32_t hello_timeout_ms;	/* a connection's time to say HELLO */
	uint32_t slice_timeout_ms;	/* a page several ranks write: time
					 * for its last slice to be asked for
					 * and published (core/slice.c) */
	uint64_t page_size;
	uint32_t block_tokens;
	uint32_t max_clients;
	uint32_t max_per_process;	/* handles one process may attach */
	uint32_t max_pins;		/* pin slots per client */
	uint32_t low_watermark;		/* percent of pages kept free */
	uint32_t high_watermark;	/* percent eviction frees up to */
	uint32_t socket_mode;
	uint32_t tick_ms;
	enum kvd_hugepages hugepages;
	int log_level;
	bool foreground;
	uid_t allow_uid[KVD_MAX_ALLOW];
	int n_allow_uid;
	gid_t allow_gid[KVD_MAX_ALLOW];
	int n_allow_gid;
	char spill_dir[256];		/* empty: no spill tier */
	uint64_t spill_size;		/* bytes of slots under spill_dir */
	int spill_io;			/* enum kvd_sio_kind: auto, uring, threads */
	int eviction;			/* enum kvd_eviction (policy.h) */
	int pin_barrier;		/* KVD_PIN_BARRIER_* */
	char metrics_listen[64];		/* as given; empty = off */
	struct sockaddr_storage metrics_addr;	/* parsed */
	/* KV events for cluster routers (events.c); empty: none. */
	char kv_events[KVD_ENDPOINT];		/* PUB endpoint */
	char kv_events_replay[KVD_ENDPOINT];	/* ROUTER endpoint, or empty */
	char kv_events_topic[KVD_TOPIC];	/* template: {host}, {model} */
	uint32_t kv_events_buffer;		/* batches kept for replay */
	uint32_t kv_events_hwm;			/* ZMQ_SNDHWM, batches */
	uint32_t kv_events_stall_ms;		/* full queue tolerated; 0: ever */
	int kv_events_hash;			/* enum kvd_events_hash */
	int kv_events_format;			/* enum kvd_events_format */
	char kv_events_host_medium[KVD_MEDIUM];	/* a host pool's medium */
	bool kv_events_connect;			/* connect the PUB, not bind */
	/* Remote tier (remote.c); remote empty: none. */
	char remote[2048];		/* "memcached:HOST:PORT,..." as given */
	int remote_write;		/* enum kvd_remote_write */
	char remote_secret_file[256];	/* empty: none */
	bool remote_insecure;		/* run without a secret (warned) */
	uint32_t remote_timeout_ms;	/* every remote operation */
	char remote_prefix[64];		/* item keys start with it */
	struct kvd_config_src src[KVD_CONFIG_MAX_KEYS];	/* by options[] row */
};

enum kvd_remote_write {
	KVD_REMOTE_PUBLISH = 0,		/* write a block when it is published */
	KVD_REMOTE_EVICT = 1,		/* only when the pool evicts it */
};

#endif
