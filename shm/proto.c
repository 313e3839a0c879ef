// SPDX-License-Identifier: MIT
/*
 * proto.c - validation of protocol messages (see proto.h). No I/O: the
 * caller has the header and `len` payload bytes in memory.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "key.h"
#include "proto.h"

static int bad(const char **why, const char *w)
{
	if (why)
		*why = w;
	return -EBADMSG;
}

static int counted(const void *p, uint32_t len, uint64_t rec, uint64_t *n,
		   const char **why)
{
	struct kvproto_count c;

	if (len < sizeof(c))
		return bad(why, "payload shorter than its record count");
	memcpy(&c, p, sizeof(c));
	if (c.n == 0 || c.n > KVPROTO_MAX_COUNT)
		return bad(why, "record count is 0 or over the limit");
	if (sizeof(c) + (uint64_t)c.n * rec != len)
		return bad(why, "payload length does not match its record count");
	*n = c.n;
	return 0;
}

/* ----------------------------------------------------------- checks
 * What a frame's size rule does not cover (the table's check column,
 * proto.h). Each runs after the rule, on a payload of the right size. */

static int kvproto_check_alloc(const struct kvproto_hdr *h, const void *p, uint32_t bt,
			       const char **why)
{
	struct kvproto_alloc a;

	(void)h;
	(void)bt;
	memcpy(&a, p, sizeof(a));
	if (!a.n || a.n > KVPROTO_MAX_COUNT)
		return bad(why, "ALLOC count is 0 or over the limit");
	if (a.flags)
		return bad(why, "ALLOC has unknown flags");
	return 0;
}

static int kvproto_check_alloc_keys(const struct kvproto_hdr *h, const void *p, uint32_t bt,
				    const char **why)
{
	struct kvproto_alloc a;

	(void)bt;
	memcpy(&a, p, sizeof(a));
	if (!a.n || a.n > KVPROTO_MAX_COUNT)
		return bad(why, "ALLOC_KEYS count is 0 or over the limit");
	if (a.flags & ~KVPROTO_ALLOC_SINGLE)
		return bad(why, "ALLOC_KEYS has unknown flags");
	if (sizeof(a) + (uint64_t)a.n * sizeof(struct kvproto_claim) != h->len)
		return bad(why, "payload length does not match its record count");
	return 0;
}

static int kvproto_check_alloc_r(const struct kvproto_hdr *h, const void *p, uint32_t bt,
				 const char **why)
{
	uint64_t n;

	(void)bt;
	if (h->len == sizeof(struct kvproto_count)) {
		struct kvproto_count c;

		memcpy(&c, p, sizeof(c));
		/* The one short form: zero pages granted. */
		return c.n ? bad(why, "payload length does not match its record count") : 0;
	}
	return counted(p, h->len, sizeof(struct kvproto_pg), &n, why);
}

static int kvproto_check_stat(const struct kvproto_hdr *h, const void *p, uint32_t bt,
			      const char **why)
{
	struct kvproto_stat st;

	(void)h;
	(void)bt;
	memcpy(&st, p, sizeof(st));
	if (st.flags)
		return bad(why, "STAT has unknown flags");
	return 0;
}

static int kvproto_check_fetch(const struct kvproto_hdr *h, const void *p, uint32_t bt,
			       const char **why)
{
	struct kvproto_fetch f;

	memcpy(&f, p, sizeof(f));
	if (!f.n || f.n > KVPROTO_MAX_COUNT)
		return bad(why, "FETCH count is 0 or over the limit");
	if (f.flags)
		return bad(why, "FETCH has unknown flags");
	if (kvproto_fetch_bytes(f.n, bt) != h->len)
		return bad(why, "FETCH length does not match its count");
	return 0;
}

static int kvproto_check_pool(const struct kvproto_hdr *h, const void *p, uint32_t bt,
			      const char **why)
{
	struct kvproto_pool q;

	(void)h;
	(void)bt;
	memcpy(&q, p, sizeof(q));
	if (q.flags)
		return bad(why, "POOL flags not zero");
	return 0;
}

static int kvproto_check_pool_r(const struct kvproto_hdr *h, const void *p, uint32_t bt,
				const char **why)
{
	struct kvproto_pool_r q;
	uint64_t all;

	(void)h;
	(void)bt;
	memcpy(&q, p, sizeof(q));
	if (!q.n_chunks || q.n_chunks > KVPROTO_MAX_CHUNKS || !q.chunk_bytes ||
	    !q.granularity || q.chunk_bytes % q.granularity ||
	    __builtin_mul_overflow(q.chunk_bytes, (uint64_t)q.n_chunks, &all) ||
	    !q.pool_bytes || q.pool_bytes > all)
		return bad(why, "POOL reply: chunk count, chunk size or pool size out of range");
	return 0;
}

static int kvproto_check_drop(const struct kvproto_hdr *h, const void *p, uint32_t bt,
			      const char **why)
{
	struct kvproto_drop q;

	(void)h;
	(void)bt;
	memcpy(&q, p, sizeof(q));
	if (q.flags)
		return bad(why, "DROP has unknown flags");
	return 0;
}

static int kvproto_check_reset(const struct kvproto_hdr *h, const void *p, uint32_t bt,
			       const char **why)
{
	struct kvproto_reset q;

	(void)h;
	(void)bt;
	memcpy(&q, p, sizeof(q));
	if (q.flags)
		return bad(why, "RESET has unknown flags");
	return 0;
}

static bool nul_in(const char *s, size_t n)
{
	return memchr(s, 0, n) != NULL;
}

static int kvproto_check_admin(const struct kvproto_hdr *h, const void *p, uint32_t bt,
			       const char **why)
{
	struct kvproto_admin q;

	(void)bt;
	memcpy(&q, p, sizeof(q));
	if (q.op < KVPROTO_ADMIN_DROP_NS || q.op > KVPROTO_ADMIN_UNPIN)
		return bad(why, "ADMIN names no known operation");
	if (!nul_in(q.model, sizeof(q.model)) || !nul_in(q.tenant, sizeof(q.tenant)) ||
	    !nul_in(q.label, sizeof(q.label)))
		return bad(why, "ADMIN has a name that is not NUL-terminated");
	if ((uint64_t)h->len != sizeof(q) + (uint64_t)q.n_tokens * 4)
		return bad(why, "ADMIN's length is not its header and n_tokens tokens");
	if (q.op != KVPROTO_ADMIN_PIN && q.n_tokens)
		return bad(why, "ADMIN carries tokens only to pin");
	if (q.op == KVPROTO_ADMIN_PIN && (!q.n_tokens || !q.ttl_s ||
					  q.ttl_s > KVPROTO_PIN_TTL_MAX))
		return bad(why, "ADMIN pin: no tokens, or a time to live out of 1..30 days");
	return 0;
}

static int kvproto_check_pin(const struct kvproto_hdr *h, const void *p, uint32_t bt,
			     const char **why)
{
	struct kvproto_pin q;

	(void)bt;
	memcpy(&q, p, sizeof(q));
	if (!q.n || q.n > KVPROTO_PIN_BLOCKS)
		return bad(why, "PIN names no blocks, or more than one pin holds");
	if ((uint64_t)h->len != sizeof(q) + (uint64_t)q.n * sizeof(struct kvshm_key))
		return bad(why, "PIN's length is not its header and n keys");
	if (!q.ttl_s || q.ttl_s > KVPROTO_PIN_TTL_MAX)
		return bad(why, "PIN's time to live is out of 1..30 days");
	if ((q.flags & ~KVPROTO_PIN_FLAT) || q.pad || !nul_in(q.label, sizeof(q.label)))
		return bad(why, "PIN has unknown flags or an unterminated label");
	return 0;
}

static int kvproto_check_unpin(const struct kvproto_hdr *h, const void *p, uint32_t bt,
			       const char **why)
{
	struct kvproto_unpin q;

	(void)h;
	(void)bt;
	memcpy(&q, p, sizeof(q));
	if (q.flags)
		return bad(why, "UNPIN has unknown flags");
	return 0;
}

/* ------------------------------------------------------------ rules */

/* What a broken size rule says, after the frame's desc. */
#define KVPROTO_SIZE_MSG_NONE		" carries no payload"
#define KVPROTO_SIZE_MSG_EXACT		" has the wrong size"
#define KVPROTO_SIZE_MSG_MIN		" shorter than its header"
#define KVPROTO_SIZE_MSG_MIN_BT		" shorter than its header"
#define KVPROTO_SIZE_MSG_COUNTED	""
#define KVPROTO_SIZE_MSG_COUNTED_BT	""
#define KVPROTO_SIZE_MSG_CUSTOM		""

struct kvproto_rule {
	bool known;
	uint8_t size;			/* enum kvproto_size */
	uint32_t bytes;
	int (*check)(const struct kvproto_hdr *h, const void *p, uint32_t bt, const char **why);
	const char *bad_size;		/* "<desc> has the wrong size", ... */
	const char *no_ns;		/* "<desc> before a namespace is declared" */
};

#define KVPROTO_RULE_ROW(name, type, desc, size, bytes, check, hello, handler)            \
	[type] = { true, KVPROTO_SIZE_##size, (uint32_t)(bytes), check,                     \
		   desc KVPROTO_SIZE_MSG_##size, desc " before a namespace is declared" },

static const struct kvproto_rule rules[KVPROTO_TYPE_MAX + 1] = {
	KVPROTO_FRAMES(KVPROTO_RULE_ROW)
};

int kvproto_decode(const struct kvproto_hdr *h, const void *payload,
		   uint32_t bt, const char **why)
{
	const struct kvproto_rule *r;
	uint64_t n;
	int rc;

	if (h->magic != KVPROTO_MAGIC)
		return bad(why, "bad message magic");
	if (h->len > KVPROTO_MAX_LEN)
		return bad(why, "message longer than the limit");
	if (h->len && !payload)
		return bad(why, "missing payload");
	if (h->type > KVPROTO_TYPE_MAX || !rules[h->type].known)
		return bad(why, "unknown message type");
	r = &rules[h->type];
	switch (r->size) {
	case KVPROTO_SIZE_NONE:
		if (h->len)
			return bad(why, r->bad_size);
		break;
	case KVPROTO_SIZE_EXACT:
		if (h->len != r->bytes)
			return bad(why, r->bad_size);
		break;
	case KVPROTO_SIZE_MIN:
	case KVPROTO_SIZE_MIN_BT:
		if (r->size == KVPROTO_SIZE_MIN_BT && (!bt || bt > KVSHM_MAX_BLOCK_TOKENS))
			return bad(why, r->no_ns);
		if (h->len < r->bytes)
			return bad(why, r->bad_size);
		break;
	case KVPROTO_SIZE_COUNTED:
	case KVPROTO_SIZE_COUNTED_BT:
		if (r->size == KVPROTO_SIZE_COUNTED_BT && (!bt || bt > KVSHM_MAX_BLOCK_TOKENS))
			return bad(why, r->no_ns);
		rc = counted(payload, h->len,
			     r->bytes + (r->size == KVPROTO_SIZE_COUNTED_BT ? (uint64_t)bt * 4 : 0),
			     &n, why);
		if (rc)
			return rc;
		break;
	default:	/* CUSTOM */
		break;
	}
	return r->check ? r->check(h, payload, bt, why) : 0;
}

/* "64 KiB", "2 MiB", "12345 bytes"; and the page-size flag value. */
static void human(char *out, size_t len, uint64_t b)
{
	if (b && b % (1u << 20) == 0)
		snprintf(out, len, "%llu MiB", (unsigned long long)(b >> 20));
	else if (b && b % 1024 == 0)
		snprintf(out, len, "%llu KiB", (unsigned long long)(b >> 10));
	else
		snprintf(out, len, "%llu bytes", (unsigned long long)b);
}

bool kvproto_page_waste(char *buf, size_t len, const char *model, uint64_t ns_page,
			uint64_t slot)
{
	uint64_t fit = (ns_page + 4095) / 4096 * 4;	/* KiB, page-size's 4K steps */
	char a[32], b[32];

	/* Only when a daemon with fitting pages would at least halve it. */
	if (!ns_page || fit * 1024 * 2 > slot)
		return false;
	human(a, sizeof(a), ns_page);
	human(b, sizeof(b), slot);
	if (len)
		snprintf(buf, len,
			 "model %s fills %s of each %s pool page (%.1f%%): the rest of every page it takes stays unused; a kvcached with --page-size %lluK fits it",
			 model, a, b, 100.0 * (double)ns_page / (double)slot,
			 (unsigned long long)fit);
	return true;
}

int kvproto_socket_path(char *buf, size_t len)
{
	const char *env = getenv("KVCACHED_SOCKET");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int n;

	if (env && *env)
		n = snprintf(buf, len, "%s", env);
	else if (geteuid() == 0)
		n = snprintf(buf, len, "/run/kvcached/kvcached.sock");
	else if (xdg && *xdg)
		n = snprintf(buf, len, "%s/kvcached.sock", xdg);
	else
		n = snprintf(buf, len, "/tmp/kvcached-%u/kvcached.sock", (unsigned)geteuid());
	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	return 0;
}

int kvproto_part(uint32_t kv_heads, bool latent, const struct kvshm_shard *shard,
		 struct kvproto_part *out, const char **why)
{
	uint32_t tp = shard->tp_size ? shard->tp_size : 1, r = shard->tp_rank;
	const char *w = NULL;

	memset(out, 0, sizeof(*out));
	if (r >= tp)
		w = "tp_rank is not below tp_size";
	else if (!kv_heads)
		w = "0 KV heads";
	else if (latent && kv_heads != 1)
		w = "a latent (MLA) model declares 1 KV head";
	else if (latent) {
		out->heads = 1;
		out->writers = 1;
		out->writes = r == 0;
	} else if (tp <= kv_heads) {
		if (kv_heads % tp)
			w = "tp_size does not divide the model's KV heads";
		out->heads = kv_heads / tp;
		out->head0 = r * out->heads;
		out->slice = r;
		out->writers = tp;
		out->writes = true;
	} else {
		if (tp % kv_heads)
			w = "the model's KV heads do not divide tp_size";
		out->heads = 1;
		out->head0 = r / (tp / kv_heads);
		out->slice = out->head0;
		out->writers = kv_heads;
		out->writes = r % (tp / kv_heads) == 0;
	}
	if (!w && out->writers > KVSHM_MAX_WRITERS)
		w = "more than 32 ranks would write slices of one page";
	if (w) {
		if (why)
			*why = w;
		return -EINVAL;
	}
	return 0;
}

int kvproto_hello_ns(const struct kvproto_hello *hi, struct kvshm_ns *ns)
{
	const bool latent = hi->flags & KVPROTO_HELLO_LATENT;
	uint64_t pb = hi->block_tokens;
	const uint64_t f[5] = { hi->layers, latent ? 1 : 2, hi->kv_heads, hi->head_dim,
				hi->dtype_bytes };
	size_t nl = strnlen(hi->model, KVSHM_MODEL_NAME);
	struct kvproto_part part;
	int i;

	if ((hi->flags & ~(KVPROTO_HELLO_ENGINE_KEYS | KVPROTO_HELLO_NO_INSERT | KVPROTO_HELLO_LATENT)) ||
	    !nl || nl == KVSHM_MODEL_NAME || hi->pos_kind > KVSHM_POS_MAX || hi->max_share > 100 ||
	    hi->salt_len > KVPROTO_MAX_SALT ||
	    (hi->dtype_bytes != 1 && hi->dtype_bytes != 2 && hi->dtype_bytes != 4 &&
	     hi->dtype_bytes != 8) ||
	    !hi->layers || hi->layers > 4096 || !hi->kv_heads || hi->kv_heads > 4096 ||
	    !hi->head_dim || hi->head_dim > 65536 || !hi->block_tokens ||
	    hi->block_tokens > KVSHM_MAX_BLOCK_TOKENS ||
	    kvproto_part(hi->kv_heads, latent, &hi->shard, &part, NULL) ||
	    hi->shard.pp_rank >= (hi->shard.pp_size ? hi->shard.pp_size : 1))
		return -EINVAL;
	for (i = 0; i < 5; i++)
		pb *= f[i];	/* at most 2^10 * 2^12 * 2 * 2^12 * 2^16 * 8: no overflow */
	memset(ns, 0, sizeof(*ns));
	ns->dtype_bytes = hi->dtype_bytes;
	ns->layers = hi->layers;
	ns->kv_heads = hi->kv_heads;
	ns->head_dim = hi->head_dim;
	ns->block_tokens = hi->block_tokens;
	ns->pos_kind = hi->pos_kind;
	ns->kind = hi->flags & KVPROTO_HELLO_ENGINE_KEYS ? KVSHM_NS_ENGINE : KVSHM_NS_TOKENS;
	ns->layout = latent ? KVSHM_KV_LATENT : KVSHM_KV_SPLIT;
	ns->page_bytes = pb;
	memcpy(ns->model, hi->model, nl);
	ns->pp_rank = hi->shard.pp_rank;
	ns->pp_size = hi->shard.pp_size ? hi->shard.pp_size : 1;
	ns->id = kvshm_ns_id(ns);
	return 0;
}

int kvproto_ns_declared(const struct kvshm_ns *ns, struct kvshm_ns *out)
{
	struct kvproto_hello hi;

	memset(&hi, 0, sizeof(hi));
	hi.dtype_bytes = ns->dtype_bytes;
	hi.layers = ns->layers;
	hi.kv_heads = ns->kv_heads;
	hi.head_dim = ns->head_dim;
	hi.block_tokens = ns->block_tokens;
	hi.pos_kind = ns->pos_kind;
	hi.shard.pp_rank = ns->pp_rank;
	hi.shard.pp_size = ns->pp_size;
	if (ns->kind > KVSHM_NS_ENGINE || ns->layout > KVSHM_KV_LATENT || ns->resv)
		return -EINVAL;
	hi.flags = (ns->kind == KVSHM_NS_ENGINE ? KVPROTO_HELLO_ENGINE_KEYS : 0) |
		   (ns->layout == KVSHM_KV_LATENT ? KVPROTO_HELLO_LATENT : 0);
	memcpy(hi.model, ns->model, sizeof(hi.model));
	return kvproto_hello_ns(&hi, out);
}

int kvproto_client_socket_path(char *buf, size_t len)
{
	return kvproto_client_socket_path_in(buf, len, "/run/kvcached/kvcached.sock");
}

int kvproto_client_socket_path_in(char *buf, size_t len, const char *sys)
{
	const char *env = getenv("KVCACHED_SOCKET");
	int rc = kvproto_socket_path(buf, len);

	if (rc || (env && *env) || geteuid() == 0 || !access(buf, F_OK))
		return rc;
	if (!access(sys, F_OK) && len > strlen(sys))
		strcpy(buf, sys);
	return 0;
}

bool kvproto_can_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ok = fd >= 0 && !connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	if (fd >= 0)
		close(fd);
	return ok;
}
