// SPDX-License-Identifier: MIT
/*
 * memcheck.c - the memory kvcached can take (see memcheck.h).
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memcheck.h"

static int read_text(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return -errno;
	n = fread(buf, 1, len - 1, f);
	fclose(f);
	buf[n] = 0;
	return 0;
}

int kvd_mem_parse_limit(const char *text, uint64_t *out)
{
	unsigned long long v;
	char *end;

	while (isspace((unsigned char)*text))
		text++;
	if (!strncmp(text, "max", 3)) {
		*out = UINT64_MAX;
		return 0;
	}
	if (!isdigit((unsigned char)*text))
		return -EINVAL;
	errno = 0;
	v = strtoull(text, &end, 10);
	if (errno || (*end && !isspace((unsigned char)*end)))
		return -EINVAL;
	*out = v;
	return 0;
}

static int read_u64(const char *path, uint64_t *out)
{
	char buf[64];
	int rc = read_text(path, buf, sizeof(buf));

	return rc ? rc : kvd_mem_parse_limit(buf, out);
}

/* A /proc/meminfo field: its number, times 1024 where the line says kB;
 * UINT64_MAX if there is no such field. */
static uint64_t meminfo(const char *field)
{
	char buf[8192], *p, *end;
	size_t fl = strlen(field);
	uint64_t v;

	if (read_text("/proc/meminfo", buf, sizeof(buf)))
		return UINT64_MAX;
	for (p = buf; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		if (strncmp(p, field, fl) || p[fl] != ':')
			continue;
		v = strtoull(p + fl + 1, &end, 10);
		while (*end == ' ')
			end++;
		return !strncmp(end, "kB", 2) ? v * 1024 : v;
	}
	return UINT64_MAX;
}

uint64_t kvd_hugetlb_free(void)
{
	uint64_t n = meminfo("HugePages_Free"), sz = meminfo("Hugepagesize");

	return n == UINT64_MAX || sz == UINT64_MAX ? 0 : n * sz;
}

/*
 * Walk a cgroup path up to its root under mount `root`, lowering *avail
 * to limit - usage at every level that has a limit.
 */
static void cgroup_walk(const char *root, const char *cg, const char *limit_file,
			const char *usage_file, uint64_t *avail, char *what, size_t what_len)
{
	char path[4096], dir[3000];
	uint64_t lim, use;

	snprintf(dir, sizeof(dir), "%s", cg);
	for (;;) {
		char *slash;

		snprintf(path, sizeof(path), "%s%s/%s", root, dir, limit_file);
		if (!read_u64(path, &lim) && lim != UINT64_MAX && lim < (1ull << 62)) {
			snprintf(path, sizeof(path), "%s%s/%s", root, dir, usage_file);
			if (read_u64(path, &use))
				use = 0;
			use = use < lim ? lim - use : 0;
			if (use < *avail) {
				*avail = use;
				if (what)
					snprintf(what, what_len, "cgroup %s %s", *dir ? dir : "/",
						 limit_file);
			}
		}
		slash = strrchr(dir, '/');
		if (!slash || !*dir)
			break;
		*slash = 0;
	}
}

int kvd_mem_available(uint64_t *avail, char *what, size_t what_len)
{
	char cg[8192], *line;
	uint64_t m = meminfo("MemAvailable");
	int found = m != UINT64_MAX;

	*avail = m;
	if (what && found)
		snprintf(what, what_len, "MemAvailable");
	if (read_text("/proc/self/cgroup", cg, sizeof(cg)))
		return found ? 0 : -ENOENT;
	for (line = strtok(cg, "\n"); line; line = strtok(NULL, "\n")) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		uint64_t before = *avail;

		if (!c2)
			continue;
		*c2 = 0;
		if (!strcmp(c1 + 1, "")) {	/* v2: "0::/path" */
			cgroup_walk("/sys/fs/cgroup", c2 + 1, "memory.max", "memory.current",
				    avail, what, what_len);
			cgroup_walk("/sys/fs/cgroup/unified", c2 + 1, "memory.max",
				    "memory.current", avail, what, what_len);
		} else if (strstr(c1 + 1, "memory")) {	/* v1: "4:memory:/path" */
			cgroup_walk("/sys/fs/cgroup/memory", c2 + 1, "memory.limit_in_bytes",
				    "memory.usage_in_bytes", avail, what, what_len);
		}
		found |= *avail != before;
	}
	return found ? 0 : -ENOENT;
}
