// SPDX-License-Identifier: MIT
/*
 * engine.c - the README's "Using it from an engine", as a program: attach
 * as Llama-3-8B (bf16, 16-token blocks: 2 MiB pages), run one prompt
 * through the cache twice, and print what each run found. The first run
 * misses and publishes; the second hits every full block. Where an engine
 * would run its model, this one writes a pattern into the pages, and
 * checks it when they come back.
 *
 *   cc -o engine engine.c $(pkg-config --cflags --libs kvclient)
 *   ./engine [SOCKET]      # default: $KVCACHED_SOCKET, else the default path
 *
 * The daemon's pages must be at least 2 MiB (its default). Exit status 0
 * when the second run hit every full block with the bytes written for it.
 */
#include <stdio.h>
#include <string.h>

#include <kvclient.h>

/* The engine's model writes block i's KV; here, a pattern. */
static void compute_kv(void *page, size_t bytes, size_t i)
{
	memset(page, 0x40 + (int)(i % 64), bytes);
}

static int kv_ok(const unsigned char *page, size_t bytes, size_t i)
{
	return page[0] == 0x40 + i % 64 && page[bytes - 1] == 0x40 + i % 64;
}

/* quote: prefill */
/* One prompt through the cache: returns the blocks it found cached. */
static int prefill(kvc_t *c, const uint32_t *tokens, size_t n_tokens)
{
	struct kvc_req *r;
	int hits, got, rc, i;

	rc = kvc_req_new(c, tokens, n_tokens, NULL, 0, &r);
	if (rc < 0)
		return rc;
	hits = kvc_lookup(r);           /* blocks 0..hits-1: pinned, verified */
	if (hits < 0) {
		kvc_req_free(r);
		return hits;
	}
	for (i = 0; i < hits; i++)      /* read the cached KV */
		if (!kv_ok(kvc_block(r, i), kvc_page_bytes(c), i))
			hits = -1;
	got = hits >= 0 ? kvc_alloc(r) : 0;   /* pages for hits..hits+got-1 */
	for (i = hits; i < hits + got; i++)   /* prefill the rest into them */
		compute_kv(kvc_block(r, i), kvc_page_bytes(c), i);
	if (got > 0)
		kvc_publish(r);         /* now every process can hit them */
	kvc_req_free(r);                /* unpin: no system call */
	return hits;
}
/* end quote */

int main(int argc, char **argv)
{
	uint32_t tokens[100];
	char err[400] = "";
	int i, first, second;

	for (i = 0; i < 100; i++)
		tokens[i] = 1000 + i;
	/* quote: open */
	struct kvc_model m = { .size = sizeof(m), .name = "llama-3-8b@main",
		.dtype_bytes = 2, .layers = 32, .kv_heads = 8, .head_dim = 128,
		.block_tokens = 16, .pos_kind = KVC_POS_ROPE };
	struct kvc_options o = { .size = sizeof(o), .socket_path = argc > 1 ? argv[1] : NULL,
		.errbuf = err, .errbuf_len = sizeof(err) };
	kvc_t *c;
	int rc = kvc_open(&m, &o, &c);  /* once per process */

	if (rc) {
		fprintf(stderr, "kvc_open: %s%s%s\n", kvc_strerror(rc), err[0] ? ": " : "", err);
		return 1;
	}
	/* end quote */
	first = prefill(c, tokens, 100);
	second = prefill(c, tokens, 100);
	printf("first run: %d of %zu blocks cached; second run: %d\n", first,
	       (size_t)100 / kvc_block_tokens(c), second);
	kvc_close(c);
	return first >= 0 && second == 100 / 16 ? 0 : 1;
}
