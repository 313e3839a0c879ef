// SPDX-License-Identifier: MIT
/*
 * kvev.c - a real client for the KV events tests (tests/python/
 * test_kv_events.py): attaches to a kvcached with the test geometry
 * (16-token blocks, 4 KiB pages) under a model name it is given, runs
 * requests the way an engine does (kvt_put: look up, check hits, allocate,
 * fill, publish) and prints, one JSON object per line, what a subscriber
 * to kvcached's events should then see: each prompt's token ids and the
 * 128-bit keys of its blocks.
 *
 *   kvev put SOCK MODEL NTOKENS SHARED SEED...   one prompt per seed
 *   kvev models SOCK PREFIX COUNT NTOKENS        COUNT models in turn
 *                                                (PREFIX0, PREFIX1, ...),
 *                                                one prompt each, each
 *                                                detached before the next
 *   kvev restore SOCK MODEL NTOKENS SHARED SEED  look up; restore a
 *                                                spilled run if any
 *   kvev flood SOCK MODEL PROMPTS SEED           PROMPTS 8-block prompts,
 *                                                as fast as it can
 *   kvev drop SOCK MODEL                         drop the namespace's blocks
 *                                                (kvc_drop_namespace)
 *
 * Exit status 0 when every request worked, 1 otherwise (the reason on
 * stderr). Not a test itself: the Python suite runs it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/harness.h"

static kvc_t *attach(const char *sock, const char *model)
{
	struct kvc_model m = kvt_model();
	struct kvc_options o = { .size = sizeof(o), .socket_path = sock };
	kvc_t *c = NULL;
	int rc;

	m.name = model;
	rc = kvc_open(&m, &o, &c);
	if (rc) {
		fprintf(stderr, "kvev: attach %s as %s: %s\n", sock, model, kvc_strerror(rc));
		return NULL;
	}
	return c;
}

/* {"model":..,"seed":..,"hits":..,"keys":["lo:hi",..],"tokens":[..]} */
static void print_prompt(kvc_t *c, const char *model, uint32_t seed, const uint32_t *t,
			 size_t n, int hits)
{
	struct kvc_key k[64];
	int nb = kvc_keys(c, t, n, NULL, 0, k, 64), i;
	size_t j;

	printf("{\"model\":\"%s\",\"seed\":%u,\"hits\":%d,\"keys\":[", model, seed, hits);
	for (i = 0; i < nb && i < 64; i++)
		printf("%s\"%016" PRIx64 "%016" PRIx64 "\"", i ? "," : "", k[i].hi, k[i].lo);
	printf("],\"tokens\":[");
	for (j = 0; j < n; j++)
		printf("%s%u", j ? "," : "", t[j]);
	printf("]}\n");
}

static int put(kvc_t *c, const char *model, size_t n, size_t shared, uint32_t seed, bool show)
{
	uint32_t t[1024];
	int hits;

	if (n > 1024)
		return -E2BIG;
	kvt_tokens(t, n, shared, seed);
	hits = kvt_put(c, t, n, NULL);
	if (hits < 0) {
		fprintf(stderr, "kvev: %s seed %u: %s\n", model, seed,
			hits == -1000 ? "a hit page held the wrong bytes" : kvc_strerror(hits));
		return hits;
	}
	if (show)
		print_prompt(c, model, seed, t, n, hits);
	return 0;
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "";
	kvc_t *c;
	int i, rc = 0;

	if (!strcmp(cmd, "put") && argc >= 7) {
		c = attach(argv[2], argv[3]);
		if (!c)
			return 1;
		for (i = 6; i < argc && !rc; i++)
			rc = put(c, argv[3], strtoul(argv[4], NULL, 10), strtoul(argv[5], NULL, 10),
				 (uint32_t)strtoul(argv[i], NULL, 10), true);
		kvc_close(c);
	} else if (!strcmp(cmd, "models") && argc == 6) {
		int count = atoi(argv[4]);

		for (i = 0; i < count && !rc; i++) {
			char model[64];

			snprintf(model, sizeof(model), "%s%d", argv[3], i);
			c = attach(argv[2], model);
			if (!c)
				return 1;
			rc = put(c, model, strtoul(argv[5], NULL, 10), 0, (uint32_t)(1000 + i), true);
			kvc_close(c);
		}
	} else if (!strcmp(cmd, "restore") && argc == 7) {
		uint32_t t[1024], seed = (uint32_t)strtoul(argv[6], NULL, 10);
		size_t n = strtoul(argv[4], NULL, 10);
		struct kvc_req *r = NULL;
		int hits = 0, restored = 0;
		size_t spilled = 0;

		if (n > 1024)
			return 1;
		c = attach(argv[2], argv[3]);
		if (!c)
			return 1;
		kvt_tokens(t, n, strtoul(argv[5], NULL, 10), seed);
		rc = kvc_req_new(c, t, n, NULL, 0, &r);
		if (!rc)
			rc = hits = kvc_lookup(r);
		if (rc >= 0) {
			spilled = kvc_req_spilled(r);
			rc = restored = spilled ? kvc_restore(r) : hits;
		}
		if (rc < 0)
			fprintf(stderr, "kvev: restore: %s\n", kvc_strerror(rc));
		else
			printf("{\"hits\":%d,\"spilled\":%zu,\"restored\":%d}\n", hits, spilled,
			       restored);
		kvc_req_free(r);
		kvc_close(c);
		rc = rc < 0 ? rc : 0;
	} else if (!strcmp(cmd, "flood") && argc == 6) {
		int prompts = atoi(argv[4]);
		uint32_t seed = (uint32_t)strtoul(argv[5], NULL, 10);

		c = attach(argv[2], argv[3]);
		if (!c)
			return 1;
		for (i = 0; i < prompts && !rc; i++)
			rc = put(c, argv[3], 8 * 16, 0, seed + (uint32_t)i, false);
		kvc_close(c);
		if (!rc)
			printf("{\"published\":%d}\n", prompts);
	} else if (!strcmp(cmd, "drop") && argc == 4) {
		c = attach(argv[2], argv[3]);
		if (!c)
			return 1;
		rc = kvc_drop_namespace(c);
		if (rc < 0)
			fprintf(stderr, "kvev: drop %s: %s\n", argv[3], kvc_strerror(rc));
		else
			printf("{\"dropped\":%d}\n", rc);
		kvc_close(c);
		rc = rc < 0 ? rc : 0;
	} else {
		fprintf(stderr, "usage: kvev put SOCK MODEL NTOKENS SHARED SEED... | "
				"models SOCK PREFIX COUNT NTOKENS | "
				"restore SOCK MODEL NTOKENS SHARED SEED | "
				"flood SOCK MODEL PROMPTS SEED | drop SOCK MODEL\n");
		return 2;
	}
	fflush(stdout);
	return rc ? 1 : 0;
}
