// SPDX-License-Identifier: MIT
/*
 * drop.c - kvc_drop_namespace: one DROP round trip (daemon/core/drop.c does the
 * work).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"

int kvc_drop_namespace(kvc_t *c)
{
	struct kvproto_drop q = { KVPROTO_VERSION, 0 };
	struct kvproto_drop_r r;
	void *reply;
	uint32_t len;
	int rc;

	if (!c)
		return -EINVAL;
	rc = kvc_rpc(c, KVPROTO_DROP, &q, sizeof(q), KVPROTO_DROP_R, &reply, &len);
	if (rc)
		return rc;
	memcpy(&r, reply, sizeof(r));
	free(reply);
	return r.dropped > (uint32_t)INT32_MAX ? INT32_MAX : (int)r.dropped;
}
