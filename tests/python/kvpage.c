// SPDX-License-Identifier: MIT
/*
 * kvpage.c - the C side of the Python binding's zero-copy tests: writes and
 * checks pool pages through libkvclient exactly as a C engine would, with
 * the harness's page pattern (kvt_fill / kvt_check: 64-bit words derived
 * from each block's key), so that Python can check what C wrote and C can
 * check what Python wrote.
 *
 *   kvpage put SOCKET TOKENS   publish the prompt, its granted pages filled
 *                              with their keys' patterns (hit pages are
 *                              checked); prints "hits H"
 *   kvpage get SOCKET TOKENS   look the prompt up and check every hit page;
 *                              prints "hits H"
 *
 * TOKENS is a file of little-endian uint32 token ids. The model is the
 * harness's test model (kvt_model). Exit status: 0, 3 when a page held
 * other bytes than its pattern, 2 usage or I/O, 1 a kvclient error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/harness.h"

static uint32_t *read_tokens(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	uint32_t *t;
	long len;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	t = malloc(len > 0 ? (size_t)len : 4);
	*n = len > 0 ? (size_t)len / 4 : 0;
	if (t && *n && fread(t, 4, *n, f) != *n) {
		free(t);
		t = NULL;
	}
	fclose(f);
	return t;
}

int main(int argc, char **argv)
{
	struct kvt_daemon d = { 0 };
	uint32_t *t;
	size_t n;
	kvc_t *c;
	int rc;

	if (argc != 4 || (strcmp(argv[1], "put") && strcmp(argv[1], "get"))) {
		fprintf(stderr, "usage: kvpage put|get SOCKET TOKENS\n");
		return 2;
	}
	snprintf(d.sock, sizeof(d.sock), "%s", argv[2]);
	t = read_tokens(argv[3], &n);
	if (!t) {
		fprintf(stderr, "kvpage: cannot read tokens from %s\n", argv[3]);
		return 2;
	}
	c = kvt_open(&d, NULL);
	if (!c) {
		fprintf(stderr, "kvpage: cannot attach to %s\n", d.sock);
		free(t);
		return 1;
	}
	rc = !strcmp(argv[1], "put") ? kvt_put(c, t, n, NULL) : kvt_get(c, t, n);
	kvc_close(c);
	free(t);
	if (rc == -1000) {
		printf("a page held other bytes than its pattern\n");
		return 3;
	}
	if (rc < 0) {
		fprintf(stderr, "kvpage: %s\n", kvc_strerror(rc));
		return 1;
	}
	printf("hits %d\n", rc);
	return 0;
}
