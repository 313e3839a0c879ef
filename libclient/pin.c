// SPDX-License-Identifier: MIT
/*
 * pin.c - kvc_pin and kvc_unpin: keep a request's prefix resident with a
 * time to live, one PIN round trip (daemon/core/pin.c does the work).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"

int kvc_pin(struct kvc_req *r, uint32_t ttl_seconds)
{
	struct kvproto_pin q;
	struct kvproto_pin_r pr;
	char why[KVCI_WHY];
	uint32_t rlen, n;
	uint8_t *msg;
	void *reply;
	int rc;

	if (!r || !r->n || !ttl_seconds || ttl_seconds > KVPROTO_PIN_TTL_MAX)
		return -EINVAL;
	n = r->n > KVPROTO_PIN_BLOCKS ? KVPROTO_PIN_BLOCKS : (uint32_t)r->n;
	memset(&q, 0, sizeof(q));
	q.n = n;
	q.ttl_s = ttl_seconds;
	q.flags = r->flat ? KVPROTO_PIN_FLAT : 0;
	memcpy(q.label, r->label, sizeof(q.label) - 1);
	msg = malloc(sizeof(q) + (size_t)n * sizeof(*r->keys));
	if (!msg)
		return -ENOMEM;
	memcpy(msg, &q, sizeof(q));
	memcpy(msg + sizeof(q), r->keys, (size_t)n * sizeof(*r->keys));
	rc = kvc_rpc_why(r->c, KVPROTO_PIN, msg, (uint32_t)(sizeof(q) + (size_t)n * sizeof(*r->keys)),
			 KVPROTO_PIN_R, &reply, &rlen, why, sizeof(why));
	free(msg);
	if (rc)
		return kvci_req_why(r, rc, why);
	memcpy(&pr, reply, sizeof(pr));
	free(reply);
	if (!pr.id || pr.id > (uint32_t)INT32_MAX)
		return -EPROTO;
	return (int)pr.id;
}

int kvc_unpin(kvc_t *c, int id)
{
	struct kvproto_unpin q = { 0, 0 };
	uint32_t rlen;
	void *reply;
	int rc;

	if (!c || id <= 0)
		return -EINVAL;
	q.id = (uint32_t)id;
	rc = kvc_rpc(c, KVPROTO_UNPIN, &q, sizeof(q), KVPROTO_UNPIN_R, &reply, &rlen);
	if (rc)
		return rc;
	free(reply);
	return 0;
}
