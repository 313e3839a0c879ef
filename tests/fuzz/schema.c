// SPDX-License-Identifier: MIT
/*
 * schema.c - fuzz target for tinylm's prompt-module schema parser
 * (tools/tinylm/schema.c), and for prompt plans over what it accepts.
 *
 * Input: the whole input is a schema file body (NULs and all, not
 * NUL-terminated: the parser gets exactly `size` bytes in a buffer of that
 * size, so ASan sees any read past it).
 *
 * Oracle: no crash, no leak. A refusal is -EINVAL with a message of the
 * form "fuzz.xml:LINE:COL: ..." whose line and column lie inside the input
 * (or one past its end); after a successful parse the layout keeps its
 * promises: 1..TLM_SCHEMA_MAX_MODULES modules with distinct names, every
 * module's length is its text plus its params, union members share a
 * start, the next module starts where the longer member ends, and every
 * module ends by s.end. A plan naming the first module of each union and
 * every other module builds, and its positions stay below s.end + user
 * text, each lo at or before its own slot.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../tools/tinylm/compose.h"
#include "../../tools/tinylm/schema.h"

#include "check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_error(const char *err, const uint8_t *data, size_t size)
{
	unsigned long line, col, lines = 1, maxcol = 1, cur = 1;

	CHECK(!strncmp(err, "fuzz.xml:", 9));
	CHECK(sscanf(err + 9, "%lu:%lu:", &line, &col) == 2);
	for (size_t i = 0; i < size; i++) {
		if (data[i] == '\n')
			lines++, cur = 1;
		else if (++cur > maxcol)
			maxcol = cur;
	}
	CHECK(line >= 1 && line <= lines);
	CHECK(col >= 1 && col <= maxcol);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = malloc(size ? size : 1), err[256] = "";
	const char *names[TLM_SCHEMA_MAX_MODULES];
	struct tlm_schema s;
	struct tlm_plan p;
	size_t nm = 0;
	int rc;

	CHECK(buf);
	memcpy(buf, data, size);
	rc = tlm_schema_parse(&s, buf, size, "fuzz.xml", err, sizeof(err));
	if (rc) {
		CHECK(rc == -EINVAL || rc == -ENOMEM);
		if (rc == -EINVAL)
			check_error(err, data, size);
		CHECK(!s.mods && !s.name);
		free(buf);
		return 0;
	}
	CHECK(s.name && s.nmods >= 1 && s.nmods <= TLM_SCHEMA_MAX_MODULES);
	for (size_t k = 0; k < s.nmods; k++) {
		const struct tlm_module *m = &s.mods[k];
		uint64_t len = 0;

		for (size_t j = 0; j < m->nsegs; j++) {
			CHECK(!m->segs[j].text != !m->segs[j].param);
			len += m->segs[j].text ? m->segs[j].len : m->segs[j].plen;
		}
		CHECK(len == m->len && len >= 1);
		CHECK((uint64_t)m->start + m->len <= s.end);
		for (size_t j = 0; j < k; j++)
			CHECK(strcmp(s.mods[j].name, m->name));
		if (k && m->union_id >= 0 && m->union_id == s.mods[k - 1].union_id)
			CHECK(m->start == s.mods[k - 1].start);
		else if (k)
			CHECK(m->start >= s.mods[k - 1].start + s.mods[k - 1].len);
		if (m->union_id < 0 || !k || s.mods[k - 1].union_id != m->union_id)
			names[nm++] = m->name;
	}
	rc = tlm_plan_build(&p, &s, names, nm, NULL, 0, "?", 1, err, sizeof(err));
	CHECK(!rc || rc == -ENOMEM);
	if (!rc) {
		for (size_t i = 0; i < p.n; i++) {
			CHECK(p.pos[i] <= s.end);
			CHECK(p.lo[i] <= i);
		}
		CHECK(p.tail == p.n - 1);
		tlm_plan_free(&p);
	}
	tlm_schema_free(&s);
	free(buf);
	return 0;
}
