// SPDX-License-Identifier: MIT
/*
 * config_file.c - where settings come from: the config file (or a buffer
 * the fuzzer hands in), the command line, and the checks across settings
 * once all are applied. Each line or flag goes to kvd_config_set
 * (config.c), which reads it by its row.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../shm/proto.h"
#include "../shm/segment.h"
#include "config.h"
#include "pool/memcheck.h"


static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = 0;
	return s;
}

/*
 * The line loop over an open stream, shared by the file and the buffer
 * entry points so that the fuzzer runs exactly what the daemon runs
 * (fgets included). `name` is the path in messages.
 */
static int config_stream(struct kvd_config *cfg, FILE *f, const char *name)
{
	char line[4096], where[PATH_MAX + 32];
	int lineno = 0, rc = 0;

	while (fgets(line, sizeof(line), f)) {
		char *k, *v, *eq;

		lineno++;
		snprintf(where, sizeof(where), "%s:%d", name, lineno);
		if (!strchr(line, '\n') && !feof(f)) {
			fprintf(stderr, "kvcached: %s: line longer than %zu bytes\n", where,
				sizeof(line) - 1);
			rc = -1;
			break;
		}
		k = trim(line);
		if (!*k || *k == '#')
			continue;
		eq = strchr(k, '=');
		if (!eq) {
			fprintf(stderr, "kvcached: %s: expected 'key = value', got '%s'\n", where, k);
			rc = -1;
			break;
		}
		*eq = 0;
		v = trim(eq + 1);
		k = trim(k);
		if (!strcmp(k, "config")) {
			fprintf(stderr, "kvcached: %s: 'config' cannot be set in a config file\n",
				where);
			rc = -1;
			break;
		}
		if ((rc = kvd_config_set(cfg, k, v, where)))
			break;
	}
	if (!rc && ferror(f)) {
		fprintf(stderr, "kvcached: config %s: read error\n", name);
		rc = -1;
	}
	return rc;
}

int kvd_config_file(struct kvd_config *cfg, const char *path)
{
	FILE *f = fopen(path, "r");
	int rc;

	if (!f) {
		fprintf(stderr, "kvcached: config %s: %s\n", path, strerror(errno));
		return -1;
	}
	rc = config_stream(cfg, f, path);
	fclose(f);
	return rc;
}

int kvd_config_buf(struct kvd_config *cfg, const char *buf, size_t len, const char *name)
{
	/* fmemopen reads like a file: same fgets, same end-of-file rules. */
	FILE *f = fmemopen((void *)buf, len, "r");
	int rc;

	if (!f) {
		fprintf(stderr, "kvcached: config %s: %s\n", name, strerror(errno));
		return -1;
	}
	rc = config_stream(cfg, f, name);
	fclose(f);
	return rc;
}

int kvd_config_check(struct kvd_config *cfg)
{
	char a[256], b[256];
	uint64_t pages;

#define WHERE(key) kvd_config_where(cfg, key, a, sizeof(a))
#define WHERE2(key) kvd_config_where(cfg, key, b, sizeof(b))
	if (!cfg->socket[0]) {
		fprintf(stderr, "kvcached: socket: no path (set --socket or KVCACHED_SOCKET)\n");
		return -1;
	}
	if (!cfg->page_size || cfg->page_size % 4096) {
		fprintf(stderr, "kvcached: %s: must be a non-zero multiple of 4096 (4K)\n",
			WHERE("page-size"));
		return -1;
	}
	if (cfg->page_size > (1ull << 30)) {
		fprintf(stderr, "kvcached: %s: more than 1G (one I/O of the spill tier)\n",
			WHERE("page-size"));
		return -1;
	}
	if (cfg->pool_share) {
		uint64_t avail;
		char what[128] = "";

		if (kvd_mem_available(&avail, what, sizeof(what))) {
			fprintf(stderr, "kvcached: %s: cannot tell the memory available (no /proc/meminfo); give a size\n",
				WHERE("pool-size"));
			return -1;
		}
		cfg->pool_size = avail / 100 * cfg->pool_share / cfg->page_size * cfg->page_size;
	}
	pages = cfg->pool_size / cfg->page_size;
	if (pages < 2) {
		fprintf(stderr, "kvcached: %s: %llu bytes, fewer than 2 pages of %s\n",
			WHERE("pool-size"), (unsigned long long)cfg->pool_size,
			WHERE2("page-size"));
		return -1;
	}
	if (pages > (1u << 30)) {
		fprintf(stderr, "kvcached: %s: more than 2^30 pages of %s; raise page-size\n",
			WHERE("pool-size"), WHERE2("page-size"));
		return -1;
	}
	if (cfg->high_watermark < cfg->low_watermark) {
		fprintf(stderr, "kvcached: %s: below %s\n", WHERE("high-watermark"),
			WHERE2("low-watermark"));
		return -1;
	}
	{
		uint32_t i, j;

		for (i = 0; i < cfg->n_tenants; i++)
			for (j = 0; j < i; j++)
				if (cfg->tenants[i].salt_len == cfg->tenants[j].salt_len &&
				    !memcmp(cfg->tenants[i].salt, cfg->tenants[j].salt,
					    cfg->tenants[i].salt_len)) {
					fprintf(stderr, "kvcached: %s: tenant %s: the same salt as tenant %s (%s; a salt is one tenant)\n",
						cfg->tenants[i].where, cfg->tenants[i].name,
						cfg->tenants[j].name, cfg->tenants[j].where);
					return -1;
				}
	}
	if (cfg->kv_events_replay[0] && !cfg->kv_events[0]) {
		fprintf(stderr, "kvcached: %s: needs kv-events (the PUB endpoint)\n",
			WHERE("kv-events-replay"));
		return -1;
	}
	if (cfg->kv_events_replay[0] && !strcmp(cfg->kv_events_replay, cfg->kv_events)) {
		fprintf(stderr, "kvcached: %s: the same endpoint as %s\n", WHERE("kv-events-replay"),
			WHERE2("kv-events"));
		return -1;
	}
	if (cfg->remote[0] && !cfg->remote_secret_file[0] && !cfg->remote_insecure) {
		fprintf(stderr, "kvcached: %s: needs remote-secret-file (blocks are sealed with the cluster secret), or remote-insecure to run without one\n",
			WHERE("remote"));
		return -1;
	}
#undef WHERE
#undef WHERE2
	return 0;
}

int kvd_config_args(struct kvd_config *cfg, int argc, char **argv)
{
	const char *file = NULL;
	int i;

	/* The file first, so that flags override it wherever they stand. */
	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--config")) {
			if (i + 1 >= argc) {
				fprintf(stderr, "kvcached: --config: needs a file\n");
				return -1;
			}
			file = argv[++i];
		} else if (!strncmp(argv[i], "--config=", 9)) {
			file = argv[i] + 9;
		} else if (!strncmp(argv[i], "--", 2) && !strchr(argv[i], '=') &&
			   kvd_config_takes(argv[i] + 2) > 0) {
			i++;	/* its value, even one that reads "--config" */
		}
	}
	if (file && kvd_config_file(cfg, file))
		return -1;
	for (i = 1; i < argc; i++) {
		char key[64];
		const char *a = argv[i], *val = NULL, *eq;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			kvd_config_usage(stdout);
			return 1;
		}
		if (!strcmp(a, "--print-options")) {
			kvd_config_print_options(stdout);
			return 1;
		}
		if (!strcmp(a, "--version")) {
			printf("kvcached %s (shm layout %u, protocol %u)\n", KVD_VERSION,
			       KVSHM_VERSION, KVPROTO_VERSION);
			return 1;
		}
		if (strncmp(a, "--", 2) || strlen(a) < 3) {
			fprintf(stderr, "kvcached: unexpected argument '%s' (see --help)\n", a);
			return -1;
		}
		a += 2;
		eq = strchr(a, '=');
		if ((eq ? (size_t)(eq - a) : strlen(a)) >= sizeof(key)) {
			fprintf(stderr, "kvcached: --%s: unknown option\n", a);
			return -1;
		}
		snprintf(key, sizeof(key), "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
		if (!strcmp(key, "config")) {
			if (!eq)
				i++;
			continue;
		}
		if (kvd_config_takes(key) < 0) {
			fprintf(stderr, "kvcached: --%s: unknown option (see kvcached --help)\n", key);
			return -1;
		}
		if (eq) {
			val = eq + 1;
		} else if (!kvd_config_takes(key)) {
			val = "true";
		} else {
			if (i + 1 >= argc) {
				fprintf(stderr, "kvcached: --%s: needs a value\n", key);
				return -1;
			}
			val = argv[++i];
		}
		if (kvd_config_set(cfg, key, val, ""))
			return -1;
	}
	return kvd_config_check(cfg);
}
