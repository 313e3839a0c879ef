/* SPDX-License-Identifier: MIT */
/*
 * stats.h - a consistent-enough copy of the segment's counters, client
 * rows, namespaces and top prefixes, and its Prometheus text rendering.
 * Used by kvstat (from its read-only mapping) and by kvcached's /metrics
 * thread alike, so both show the same names and the same numbers.
 *
 * A snapshot reads with relaxed atomic loads and takes no lock: counters
 * may be a tick apart from each other, never torn. Pure code, no I/O.
 */
#ifndef KVSHM_STATS_H
#define KVSHM_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "segment.h"

#define KVSHM_STAT_N (sizeof(struct kvshm_stats) / sizeof(uint64_t))
#define KVSHM_STAT_ID(field) (offsetof(struct kvshm_stats, field) / sizeof(uint64_t))

struct kvshm_snap_client {
	int32_t pid;
	uint32_t uid;
	uint32_t ns_id;
	char comm[16];		/* NUL-terminated */
	uint64_t lookups;
	uint64_t hit_blocks;
	uint64_t miss_blocks;
	uint64_t pins_held;
	uint64_t published;
	uint64_t writing;
};

/* A namespace's display name: "model", "model tp1/2 pp0/4", and " (engine
 * keys)" after an engine-keyed namespace's (KVSHM_NS_ENGINE). */
#define KVSHM_NS_NAME (KVSHM_MODEL_NAME + 48)

struct kvshm_snap {
	struct kvshm_geometry geo;
	uint64_t segment_bytes;
	uint32_t pool_kind;
	int32_t daemon_pid;
	uint64_t start_time_ns;
	uint64_t heartbeat;
	uint64_t v[KVSHM_STAT_N];	/* indexed by KVSHM_STAT_ID(field) */
	uint32_t n_ns;
	struct kvshm_ns *ns;		/* rows in use, model NUL-terminated */
	struct kvshm_ns_stats *ns_st;	/* per row: its statistics */
	char (*ns_name)[KVSHM_NS_NAME];	/* per row: model, its stage, layout, kind */
	uint32_t n_clients;
	struct kvshm_snap_client *clients;
	uint32_t n_top;			/* sorted, most hit tokens first */
	struct kvshm_top_entry top[KVSHM_TOP];
	uint32_t n_tenants;		/* rows up to the last in use */
	struct kvshm_tenant *tenants;	/* KVSHM_TENANTS rows; name "" when free */
	uint32_t n_pinned;		/* pinned prefixes, in row order */
	struct kvshm_pinned *pinned;	/* KVSHM_PINNED rows */
};

/* Tenant row i of a snapshot is in use. */
static inline int kvshm_snap_tenant_used(const struct kvshm_snap *s, uint32_t i)
{
	return i < s->n_tenants && s->tenants[i].name[0];
}

/* Name of tenant row t in a snapshot ("-" for KVSHM_TENANT_NONE or a
 * row not in use). */
const char *kvshm_snap_tenant(const struct kvshm_snap *s, uint32_t t);

/* Namespace row i of a snapshot is in use (n_ns counts up to the last). */
static inline int kvshm_snap_ns_used(const struct kvshm_snap *s, uint32_t i)
{
	return i < s->n_ns && s->ns_name[i][0];
}

/* Take a snapshot; 0 or -ENOMEM. Free with kvshm_snap_free. */
int kvshm_snap_take(const struct kvshm_header *h, struct kvshm_snap *s);
void kvshm_snap_free(struct kvshm_snap *s);

/* Display name of namespace id in a snapshot: the model name, followed
 * by " ppR/N" for a pipeline stage, " (MLA)" for a latent page and
 * " (engine keys)" for an engine-keyed namespace ("?" if unknown). One
 * name for every tensor-parallel rank and size: they share the namespace. */
const char *kvshm_snap_model(const struct kvshm_snap *s, uint32_t ns_id);

/*
 * Length of the valid UTF-8 sequence at s, or 0 (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF); 1 for a NUL. Used by
 * everything that prints names clients supplied (/metrics, kvstat --json).
 */
int kvshm_utf8_len(const unsigned char *s);

/* One exported counter or gauge of struct kvshm_stats. */
struct kvshm_metric {
	const char *name;	/* Prometheus metric name */
	const char *type;	/* "counter" or "gauge" */
	const char *help;
	const char *label;	/* a fixed label pair, or NULL */
	const char *json;	/* stable field name for JSON */
	uint32_t stat;		/* KVSHM_STAT_ID of its field */
};

/* Every exported stat, in display order; entries sharing a name are one
 * metric family with different labels. */
extern const struct kvshm_metric kvshm_metrics[];
extern const size_t kvshm_n_metrics;

/*
 * The Prometheus text exposition format (version 0.0.4) of a snapshot:
 * the table above, pool geometry, per-client series and the top prefixes.
 * Writes at most len bytes (NUL-terminated when len > 0) and returns the
 * length the whole text needs, like snprintf.
 */
size_t kvshm_prometheus(const struct kvshm_snap *s, char *buf, size_t len);

#endif
