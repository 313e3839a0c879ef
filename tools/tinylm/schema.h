/* SPDX-License-Identifier: MIT */
/*
 * schema.h - prompt-module schemas (Prompt Cache, Gim et al. 2024) in a
 * small XML-like markup:
 *
 *	<schema name="trip">
 *	  <module name="system">You are a travel agent.</module>
 *	  <module name="plan">Plan for <param name="who" len="6"/> in May.</module>
 *	  <union>
 *	    <module name="paris">...</module>
 *	    <module name="rome">...</module>
 *	  </union>
 *	</schema>
 *
 * The schema lays every module out at its own start position: modules
 * follow each other in file order, the members of a union share one start
 * and the union is as long as its longest member. A module's length is its
 * text in tinylm's byte tokens (one position per byte, after the entities
 * &lt; &gt; &amp; &quot; &apos; are decoded; leading and trailing
 * whitespace of the module trimmed) plus the len of each param. Text
 * outside modules must be whitespace; <!-- comments --> may go anywhere
 * between elements.
 *
 * Pure parsing: no I/O but tlm_schema_load's read, no model, no cache.
 * Errors name the file, line and column.
 */
#ifndef TINYLM_SCHEMA_H
#define TINYLM_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#define TLM_SCHEMA_MAX_NAME 63
#define TLM_SCHEMA_MAX_MODULES 1024
#define TLM_SCHEMA_MAX_POS (1u << 22)

struct tlm_seg {
	char *text;		/* text segment (decoded), or NULL for a param */
	size_t len;		/* text bytes */
	char *param;		/* param name */
	uint32_t plen;		/* positions the param reserves */
};

struct tlm_module {
	char *name;
	int union_id;		/* -1: not in a union */
	uint32_t start;		/* first position id */
	uint32_t len;		/* positions: text bytes + param lens */
	struct tlm_seg *segs;
	size_t nsegs;
};

struct tlm_schema {
	char *name;
	uint64_t hash;		/* FNV-1a 64 of the schema text */
	struct tlm_module *mods;
	size_t nmods;
	uint32_t end;		/* first position after every module */
};

/*
 * Parse `len` bytes of schema text; `file` names it in errors. Returns 0,
 * -EINVAL (err: "file:line:col: what is wrong") or -ENOMEM.
 */
int tlm_schema_parse(struct tlm_schema *s, const char *text, size_t len, const char *file,
		     char *err, size_t errlen);
/* Read and parse a file: 0, -EINVAL, -ENOMEM, -EFBIG (over 16 MiB) or the
 * errno of open/read (err says which). */
int tlm_schema_load(struct tlm_schema *s, const char *path, char *err, size_t errlen);
void tlm_schema_free(struct tlm_schema *s);
/* Module by name, or NULL. */
const struct tlm_module *tlm_schema_find(const struct tlm_schema *s, const char *name);

#endif
