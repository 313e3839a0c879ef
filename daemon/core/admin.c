// SPDX-License-Identifier: MIT
/*
 * admin.c - an operator's requests to a running daemon, from kvstat: drop
 * a namespace's or a tenant's pages (drop.c), keep the prefix of a prompt
 * resident for a time and end such a pin (pin.c).
 *
 * Like RESET, an ADMIN comes instead of HELLO on a connection of its own,
 * is allowed to root and to the daemon's own user only (the peer's uid as
 * SO_PEERCRED said at accept), is answered once, and the connection ends.
 * A namespace is named by its row or its model; a tenant by the name the
 * config or the daemon gave it (kvstat's TENANTS view), never by its
 * salt: a pin of a tenant's prompt is keyed in that tenant's key space by
 * the salt the daemon holds.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../shm/key.h"
#include "kvd.h"
#include "admin.h"
#include "drop.h"
#include "pin.h"
#include "quota.h"
#include "../util/log.h"

bool kvd_admin_allowed(struct kvd *d, struct kvd_client *c, uint32_t seq, const char *what)
{
	uid_t me = geteuid();

	if (c->uid == 0 || c->uid == me)
		return true;
	kvd_stat_add(&kvshm_stats(d->h)->clients_refused, 1);
	kvd_reply_error(d, c, seq, -EPERM, true,
			"%s is allowed to root and to kvcached's own user (uid %u); uid %u is neither",
			what, (unsigned)me, (unsigned)c->uid);
	return false;
}

/* The namespace rows q names, into rows[] (at most KVD_MAX_NS): its row,
 * or those of its model (any: all rows in use when the model is ""). */
static uint32_t ns_rows_of(const struct kvd *d, const struct kvproto_admin *q, bool any,
			   uint32_t *rows)
{
	const struct kvshm_ns *t = kvshm_ns(d->h);
	uint32_t i, n = 0;

	for (i = 0; i < d->h->geo.max_ns && i < KVD_MAX_NS; i++) {
		if (!atomic_load_explicit(&t[i].used, memory_order_acquire))
			continue;
		if (q->ns_row != KVPROTO_ADMIN_ANY ? i == q->ns_row
						   : (any && !q->model[0]) ||
						     !strncmp(t[i].model, q->model, KVSHM_MODEL_NAME))
			rows[n++] = i;
	}
	return n;
}

static void name_ns(const struct kvproto_admin *q, char *buf, size_t len)
{
	if (q->ns_row != KVPROTO_ADMIN_ANY)
		snprintf(buf, len, "namespace row %u", q->ns_row);
	else
		snprintf(buf, len, "model %s", q->model);
}

static int op_drop(struct kvd *d, struct kvd_client *c, const struct kvproto_admin *q,
		   struct kvproto_admin_r *r, char *msg, size_t len)
{
	uint32_t rows[KVD_MAX_NS], n, i, t = UINT32_MAX;
	bool tenant = q->op == KVPROTO_ADMIN_DROP_TENANT;
	char what[96];

	if (tenant) {
		int row = kvd_quota_tenant_find(d, q->tenant);

		if (row < 0) {
			snprintf(msg, len, "no tenant named %s (kvstat lists them under TENANTS)",
				 q->tenant);
			return -ENOENT;
		}
		t = (uint32_t)row;
	}
	name_ns(q, what, sizeof(what));
	if (tenant && q->ns_row == KVPROTO_ADMIN_ANY && !q->model[0]) {
		kvd_drop_where(d, UINT32_MAX, t, r);	/* every namespace */
		snprintf(what, sizeof(what), "every namespace");
	} else {
		n = ns_rows_of(d, q, false, rows);
		if (!n) {
			snprintf(msg, len, "no %s in the namespace table", what);
			return -ENOENT;
		}
		for (i = 0; i < n; i++)
			kvd_drop_where(d, rows[i], t, r);
	}
	kvd_info("operator (pid %d, uid %u) dropped %s%s%s%s: %u pages, %u spill slots; %u pinned or being written stay",
		 (int)c->pid, (unsigned)c->uid, tenant ? "tenant " : "", tenant ? q->tenant : "",
		 tenant ? " in " : "", what, r->dropped, r->slots, r->left);
	return 0;
}

static int op_pin(struct kvd *d, struct kvd_client *c, const struct kvproto_admin *q,
		  const uint32_t *tokens, struct kvproto_admin_r *r, char *msg, size_t len)
{
	const uint32_t bt = d->h->geo.block_tokens;
	struct kvshm_key zero = { 0, 0 }, *keys;
	struct kvd_pin_want w;
	uint32_t rows[KVD_MAX_NS], n;
	char what[96];
	int t, rc;

	name_ns(q, what, sizeof(what));
	n = ns_rows_of(d, q, false, rows);
	if (n != 1) {
		if (!n)
			snprintf(msg, len, "no %s in the namespace table", what);
		else
			snprintf(msg, len,
				 "%s has %u namespaces (rows %u, %u%s): name one with --namespace ROW",
				 what, n, rows[0], rows[1], n > 2 ? ", ..." : "");
		return n ? -EINVAL : -ENOENT;
	}
	if (kvshm_ns(d->h)[rows[0]].kind != KVSHM_NS_TOKENS) {
		snprintf(msg, len, "%s is keyed by the engine's keys, not by tokens: its prompts cannot be pinned from tokens",
			 what);
		return -EINVAL;
	}
	t = q->tenant[0] ? kvd_quota_tenant_find(d, q->tenant) : kvd_quota_tenant_salt(d, NULL, 0);
	if (t < 0) {
		snprintf(msg, len, "no tenant named %s (kvstat lists them under TENANTS)", q->tenant);
		return -ENOENT;
	}
	r->blocks = q->n_tokens / bt;
	if (!r->blocks) {
		snprintf(msg, len, "the prompt has %u tokens, fewer than one %u-token block",
			 q->n_tokens, bt);
		return -EINVAL;
	}
	if (r->blocks > KVPROTO_PIN_BLOCKS)
		r->blocks = KVPROTO_PIN_BLOCKS;
	keys = malloc((size_t)r->blocks * sizeof(*keys));
	if (!keys) {
		snprintf(msg, len, "out of memory");
		return -ENOMEM;
	}
	memset(&w, 0, sizeof(w));
	w.ns_id = rows[0];
	w.tenant = (uint32_t)t;
	/* The tenant's key space in that namespace: its salt's root. */
	w.root = kvd_quota_root(d, (uint32_t)t, rows[0]);
	kvshm_key_chain(w.root, w.root, zero, tokens, (size_t)r->blocks * bt, bt, keys);
	w.keys = keys;
	w.n = r->blocks;
	w.ttl_s = q->ttl_s;
	w.label = q->label;
	w.pid = c->pid;
	w.uid = c->uid;
	rc = kvd_pin_add(d, &w, &r->pin_id, &r->resident, msg, len);
	free(keys);
	return rc;
}

int kvd_admin_req(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		  const void *p)
{
	struct kvproto_admin_r r = { KVPROTO_VERSION, 0, 0, 0, 0, 0, 0, 0 };
	struct kvproto_admin q;
	char msg[400] = "";
	uint32_t *tokens = NULL;
	int rc;

	memcpy(&q, p, sizeof(q));
	c->refused = true;	/* an observer: never counted as dropped */
	if (q.version != KVPROTO_VERSION) {
		kvd_reply_error(d, c, hdr->seq, -EPROTO, true,
				"ADMIN: protocol version %u, this kvcached speaks %u", q.version,
				KVPROTO_VERSION);
		return -1;
	}
	if (!kvd_admin_allowed(d, c, hdr->seq,
			       q.op == KVPROTO_ADMIN_PIN || q.op == KVPROTO_ADMIN_UNPIN
				       ? "pinning prefixes" : "dropping pages"))
		return -1;
	r.op = q.op;
	switch (q.op) {
	case KVPROTO_ADMIN_DROP_NS:
	case KVPROTO_ADMIN_DROP_TENANT:
		rc = op_drop(d, c, &q, &r, msg, sizeof(msg));
		break;
	case KVPROTO_ADMIN_PIN:
		tokens = malloc((size_t)q.n_tokens * 4);
		if (!tokens) {
			rc = -ENOMEM;
			snprintf(msg, sizeof(msg), "out of memory");
			break;
		}
		memcpy(tokens, (const uint8_t *)p + sizeof(q), (size_t)q.n_tokens * 4);
		rc = op_pin(d, c, &q, tokens, &r, msg, sizeof(msg));
		free(tokens);
		break;
	default:	/* UNPIN: kvproto_decode let no other op through */
		rc = kvd_pin_remove(d, q.pin_id, UINT32_MAX, UINT32_MAX);
		if (rc)
			snprintf(msg, sizeof(msg), "no pin %u (kvstat --pins lists them)", q.pin_id);
		r.pin_id = q.pin_id;
		break;
	}
	if (rc) {
		kvd_reply_error(d, c, hdr->seq, rc, true, "%s", msg);
		return -1;
	}
	if (!kvd_reply(d, c, KVPROTO_ADMIN_R, hdr->seq, &r, sizeof(r), NULL, 0))
		kvd_client_close(d, c, "operator served", false);
	return -1;
}
