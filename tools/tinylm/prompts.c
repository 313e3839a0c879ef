// SPDX-License-Identifier: MIT
/*
 * prompts.c - the deterministic prompts of the long-document QA workload:
 * a table document and short questions about it, in byte tokens. Shared by
 * kvdemo (its qa, multi, modules and group workloads) and kvbench's ttft
 * mode, so that both time the same prompts.
 */
#include <stdio.h>
#include <stdlib.h>

#include "tinylm.h"

static uint64_t rng(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

size_t tlm_make_doc(uint32_t *out, size_t n, uint64_t seed)
{
	static const char *city[] = { "Oslo", "Lima", "Pune", "Kyiv", "Graz", "Hue", "Tver", "Cork" };
	static const char *item[] = { "bolts", "gears", "pumps", "valves", "wires", "tiles" };
	char *buf;
	size_t len, row = 0;
	uint64_t s = seed;

	if (n < 2 || !(buf = malloc(n + 128)))
		return 0;
	len = snprintf(buf, n + 128, "Table %llu: shipments\n| id | city | item | qty | price |\n",
		       (unsigned long long)seed);
	while (len < n) {
		uint64_t r = rng(&s);

		len += snprintf(buf + len, n + 128 - len, "| %04zu | %s | %s | %llu | %llu.%02llu |\n",
				row++, city[r % 8], item[(r >> 8) % 6],
				(unsigned long long)((r >> 16) % 500),
				(unsigned long long)((r >> 32) % 900 + 10),
				(unsigned long long)((r >> 48) % 100));
		if (len > n)
			len = n;
	}
	n = tlm_tokenize(buf, n - 1, 1, out, n);
	free(buf);
	return n;
}

size_t tlm_make_question(uint32_t *out, size_t n, int i)
{
	char buf[4200];
	int len = snprintf(buf, sizeof(buf), "\nQ%d: What is the price of row %04d? A:", i,
			   (i * 37) % 60);

	while (len < (int)n && len < (int)sizeof(buf) - 1)
		buf[len++] = ' ';
	return tlm_tokenize(buf, n < (size_t)len ? n : (size_t)len, 0, out, n);
}
