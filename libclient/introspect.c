// SPDX-License-Identifier: MIT
/*
 * introspect.c - read-only views for bindings (the Python package): a
 * request's key chain, and the daemon-wide statistics a client can read,
 * the same counters, gauges, client rows and top prefixes kvstat shows,
 * taken from the handle's read-only mapping of the segment (no round
 * trip, no lock).
 *
 * Names and rendering are shm/stats.c's (kvshm_metrics[], kvshm_prometheus),
 * so a binding shows exactly what `kvstat --json` and /metrics show. Never
 * writes the segment, the ledger or the request.
 */
#include <errno.h>
#include <stdlib.h>

#include "client_int.h"
#include "../shm/stats.h"

int kvc_req_keys(const struct kvc_req *r, struct kvc_key *keys, size_t max_keys)
{
	size_t i;

	if (!r || (!keys && max_keys))
		return -EINVAL;
	for (i = 0; i < r->n && i < max_keys; i++) {
		keys[i].lo = r->keys[i].lo;
		keys[i].hi = r->keys[i].hi;
	}
	return (int)r->n;
}

int kvc_daemon_stats(const kvc_t *c, struct kvc_stat *out, size_t max)
{
	const uint64_t *v;
	size_t k;
	int rc;

	if (!c || (!out && max))
		return -EINVAL;
	if ((rc = kvc_usable(c)) == -ECHILD)
		return rc;
	/* A dead handle still maps the segment: its numbers stay readable. */
	v = (const uint64_t *)kvshm_stats(c->seg);
	for (k = 0; k < kvshm_n_metrics && k < max; k++) {
		out[k].name = kvshm_metrics[k].json;
		out[k].value = __atomic_load_n(&v[kvshm_metrics[k].stat], __ATOMIC_RELAXED);
	}
	return (int)kvshm_n_metrics;
}

int64_t kvc_daemon_metrics(const kvc_t *c, char *buf, size_t len)
{
	struct kvshm_snap s;
	size_t n;
	int rc;

	if (!c || (!buf && len))
		return -EINVAL;
	if ((rc = kvc_usable(c)) == -ECHILD)
		return rc;
	if (kvshm_snap_take(c->seg, &s))
		return -ENOMEM;
	n = kvshm_prometheus(&s, buf, len);
	kvshm_snap_free(&s);
	return (int64_t)n;
}
