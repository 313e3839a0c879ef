// SPDX-License-Identifier: MIT
/*
 * schema.c - the prompt-module schema parser (see schema.h for the
 * markup). A recursive-descent parser over a byte buffer that is never
 * assumed to be NUL-terminated, valid UTF-8 or well formed: every error
 * stops the parse with "file:line:col: message" and frees what was built.
 * Also lays the modules out at their start positions.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "schema.h"

struct cur {
	const char *b;
	size_t n, i;
	const char *file;
	char *err;
	size_t errlen;
	struct tlm_schema *s;
	int unions;
};

static int fail(struct cur *c, size_t at, const char *fmt, ...)
{
	size_t line = 1, col = 1, i;
	char msg[200];
	va_list ap;

	for (i = 0; i < at && i < c->n; i++) {
		if (c->b[i] == '\n')
			line++, col = 1;
		else
			col++;
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (c->err && c->errlen)
		snprintf(c->err, c->errlen, "%s:%zu:%zu: %s", c->file, line, col, msg);
	return -EINVAL;
}

static bool at(struct cur *c, const char *lit)
{
	size_t l = strlen(lit);

	return c->n - c->i >= l && !memcmp(c->b + c->i, lit, l);
}

static bool is_space(char ch)
{
	return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

/* Skip one comment at c->i. */
static int comment(struct cur *c)
{
	size_t start = c->i;

	for (c->i += 4; c->i < c->n && !at(c, "-->"); c->i++)
		;
	if (c->i >= c->n)
		return fail(c, start, "comment not closed (no -->)");
	c->i += 3;
	return 0;
}

/* Skip whitespace and comments. */
static int skip(struct cur *c)
{
	int rc;

	for (;;) {
		while (c->i < c->n && is_space(c->b[c->i]))
			c->i++;
		if (!at(c, "<!--"))
			return 0;
		if ((rc = comment(c)))
			return rc;
	}
}

static bool name_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       ch == '_' || ch == '-' || ch == '.' || ch == ':';
}

/* An identifier (tag or attribute name) into out. */
static int ident(struct cur *c, char *out, size_t max)
{
	size_t start = c->i, l;

	while (c->i < c->n && name_char(c->b[c->i]))
		c->i++;
	l = c->i - start;
	if (!l)
		return fail(c, start, c->i < c->n ? "expected a name, found '%c'" : "expected a name, found the end of the file",
			    c->i < c->n ? c->b[c->i] : 0);
	if (l > max)
		return fail(c, start, "name '%.*s...' longer than %zu bytes", 20, c->b + start, max);
	memcpy(out, c->b + start, l);
	out[l] = 0;
	return 0;
}

struct attr {
	char name[TLM_SCHEMA_MAX_NAME + 1];
	char value[TLM_SCHEMA_MAX_NAME + 1];
	size_t pos;		/* of the value */
};

/*
 * Attributes up to '>' or '/>' (*empty set for the latter). Values are
 * names or numbers: the same characters as names, 1..63 bytes.
 */
static int attrs(struct cur *c, const char *tag, struct attr *a, int max, int *na, bool *empty)
{
	int rc;

	*na = 0;
	for (;;) {
		size_t start;

		while (c->i < c->n && is_space(c->b[c->i]))
			c->i++;
		if (c->i >= c->n)
			return fail(c, c->i, "<%s> not closed: the file ends inside the tag", tag);
		if (at(c, "/>")) {
			c->i += 2;
			*empty = true;
			return 0;
		}
		if (c->b[c->i] == '>') {
			c->i++;
			*empty = false;
			return 0;
		}
		if (*na == max)
			return fail(c, c->i, "<%s> has too many attributes", tag);
		start = c->i;
		if ((rc = ident(c, a[*na].name, TLM_SCHEMA_MAX_NAME)))
			return rc;
		for (int k = 0; k < *na; k++)
			if (!strcmp(a[k].name, a[*na].name))
				return fail(c, start, "<%s>: attribute %s given twice", tag, a[k].name);
		while (c->i < c->n && is_space(c->b[c->i]))
			c->i++;
		if (c->i >= c->n || c->b[c->i] != '=')
			return fail(c, c->i, "<%s>: expected '=' after attribute %s", tag, a[*na].name);
		c->i++;
		while (c->i < c->n && is_space(c->b[c->i]))
			c->i++;
		if (c->i >= c->n || c->b[c->i] != '"')
			return fail(c, c->i, "<%s>: expected '\"' to open the value of %s", tag,
				    a[*na].name);
		c->i++;
		a[*na].pos = start = c->i;
		while (c->i < c->n && c->b[c->i] != '"' && c->b[c->i] != '\n')
			c->i++;
		if (c->i >= c->n || c->b[c->i] != '"')
			return fail(c, start - 1, "<%s>: value of %s not closed with '\"'", tag,
				    a[*na].name);
		if (c->i - start == 0 || c->i - start > TLM_SCHEMA_MAX_NAME)
			return fail(c, start, "<%s>: value of %s must be 1..%d bytes", tag,
				    a[*na].name, TLM_SCHEMA_MAX_NAME);
		for (size_t k = start; k < c->i; k++)
			if (!name_char(c->b[k]))
				return fail(c, k, "<%s>: value of %s: character '%c' not allowed (letters, digits, _ - . :)",
					    tag, a[*na].name, c->b[k]);
		memcpy(a[*na].value, c->b + start, c->i - start);
		a[*na].value[c->i - start] = 0;
		c->i++;
		(*na)++;
	}
}

/* The one attribute a tag must have, and no others (second name optional). */
static int want_attrs(struct cur *c, const char *tag, size_t tagpos, struct attr *a, int na,
		      const char *n1, const char *n2, int *i1, int *i2)
{
	*i1 = -1;
	if (i2)
		*i2 = -1;
	for (int k = 0; k < na; k++) {
		if (!strcmp(a[k].name, n1))
			*i1 = k;
		else if (n2 && !strcmp(a[k].name, n2))
			*i2 = k;
		else
			return fail(c, a[k].pos, "<%s>: unknown attribute %s", tag, a[k].name);
	}
	if (*i1 < 0)
		return fail(c, tagpos, "<%s> needs a %s attribute", tag, n1);
	if (n2 && *i2 < 0)
		return fail(c, tagpos, "<%s> needs a %s attribute", tag, n2);
	return 0;
}

static int add_seg(struct cur *c, struct tlm_module *m, struct tlm_seg *seg)
{
	struct tlm_seg *n = realloc(m->segs, (m->nsegs + 1) * sizeof(*n));

	(void)c;
	if (!n)
		return -ENOMEM;
	m->segs = n;
	m->segs[m->nsegs++] = *seg;
	return 0;
}

/* Text up to the next '<', entities decoded, appended as a segment. */
static int text(struct cur *c, struct tlm_module *m)
{
	static const struct { const char *e; char ch; } ent[] = {
		{ "&lt;", '<' }, { "&gt;", '>' }, { "&amp;", '&' }, { "&quot;", '"' },
		{ "&apos;", '\'' },
	};
	size_t start = c->i, l = 0;
	struct tlm_seg seg = { 0 };
	char *out;
	int rc;

	while (c->i < c->n && c->b[c->i] != '<')
		c->i++;
	if (c->i == start)
		return 0;
	out = malloc(c->i - start + 1);
	if (!out)
		return -ENOMEM;
	for (size_t k = start; k < c->i;) {
		if (c->b[k] == '&') {
			size_t e;

			for (e = 0; e < sizeof(ent) / sizeof(ent[0]); e++) {
				size_t el = strlen(ent[e].e);

				if (c->i - k >= el && !memcmp(c->b + k, ent[e].e, el)) {
					out[l++] = ent[e].ch;
					k += el;
					break;
				}
			}
			if (e == sizeof(ent) / sizeof(ent[0])) {
				free(out);
				return fail(c, k, "unknown entity (use &lt; &gt; &amp; &quot; &apos;)");
			}
			continue;
		}
		if (c->b[k] == '>') {
			free(out);
			return fail(c, k, "'>' in text (write &gt;)");
		}
		out[l++] = c->b[k++];
	}
	out[l] = 0;
	seg.text = out;
	seg.len = l;
	rc = add_seg(c, m, &seg);
	if (rc)
		free(out);
	return rc;
}

static void free_module(struct tlm_module *m)
{
	for (size_t k = 0; k < m->nsegs; k++) {
		free(m->segs[k].text);
		free(m->segs[k].param);
	}
	free(m->segs);
	free(m->name);
}

/* Trim the module's leading and trailing whitespace (in its text). */
static void trim(struct tlm_module *m)
{
	size_t k;

	if (m->nsegs && m->segs[0].text) {
		struct tlm_seg *g = &m->segs[0];

		for (k = 0; k < g->len && is_space(g->text[k]); k++)
			;
		memmove(g->text, g->text + k, g->len - k + 1);
		g->len -= k;
	}
	if (m->nsegs && m->segs[m->nsegs - 1].text) {
		struct tlm_seg *g = &m->segs[m->nsegs - 1];

		while (g->len && is_space(g->text[g->len - 1]))
			g->text[--g->len] = 0;
	}
}

/* After "<module": attributes, content, "</module>". */
static int module(struct cur *c, size_t tagpos, int union_id)
{
	struct tlm_schema *s = c->s;
	struct attr a[4];
	struct tlm_module m = { .union_id = union_id }, *nm;
	int na, in, rc;
	bool empty;
	uint64_t len = 0;

	if ((rc = attrs(c, "module", a, 4, &na, &empty)) ||
	    (rc = want_attrs(c, "module", tagpos, a, na, "name", NULL, &in, NULL)))
		return rc;
	if (empty)
		return fail(c, tagpos, "<module name=\"%s\"/> is empty: a module needs text",
			    a[in].value);
	for (size_t k = 0; k < s->nmods; k++)
		if (!strcmp(s->mods[k].name, a[in].value))
			return fail(c, a[in].pos, "module %s defined twice", a[in].value);
	if (s->nmods == TLM_SCHEMA_MAX_MODULES)
		return fail(c, tagpos, "more than %d modules", TLM_SCHEMA_MAX_MODULES);
	m.name = strdup(a[in].value);
	if (!m.name)
		return -ENOMEM;
	for (;;) {
		if ((rc = text(c, &m)))
			goto out_free;
		if (c->i >= c->n) {
			rc = fail(c, tagpos, "<module name=\"%s\"> not closed (no </module>)", m.name);
			goto out_free;
		}
		if (at(c, "</module>")) {
			c->i += 9;
			break;
		}
		if (at(c, "<!--")) {
			if ((rc = comment(c)))
				goto out_free;
			continue;
		}
		if (at(c, "<param")) {
			struct attr pa[4];
			struct tlm_seg seg = { 0 };
			size_t ppos = c->i;
			int pna, pn, pl;
			unsigned long v;
			char *end;

			c->i += 6;
			if ((rc = attrs(c, "param", pa, 4, &pna, &empty)) ||
			    (rc = want_attrs(c, "param", ppos, pa, pna, "name", "len", &pn, &pl)))
				goto out_free;
			if (!empty) {
				rc = fail(c, ppos, "<param> must be empty: write <param name=\"%s\" len=\"N\"/>",
					  pa[pn].value);
				goto out_free;
			}
			errno = 0;
			v = strtoul(pa[pl].value, &end, 10);
			if (errno || *end || pa[pl].value[0] < '1' || pa[pl].value[0] > '9' ||
			    v > 65536) {
				rc = fail(c, pa[pl].pos, "param %s: len \"%s\" must be 1..65536",
					  pa[pn].value, pa[pl].value);
				goto out_free;
			}
			for (size_t k = 0; k < m.nsegs; k++)
				if (m.segs[k].param && !strcmp(m.segs[k].param, pa[pn].value)) {
					rc = fail(c, pa[pn].pos, "param %s twice in module %s",
						  pa[pn].value, m.name);
					goto out_free;
				}
			seg.param = strdup(pa[pn].value);
			seg.plen = v;
			if (!seg.param || add_seg(c, &m, &seg)) {
				free(seg.param);
				rc = -ENOMEM;
				goto out_free;
			}
			continue;
		}
		rc = fail(c, c->i, "unexpected tag in module %s (only text, <param .../> and </module>)",
			  m.name);
		goto out_free;
	}
	trim(&m);
	for (size_t k = 0; k < m.nsegs; k++)
		len += m.segs[k].text ? m.segs[k].len : m.segs[k].plen;
	if (!len) {
		rc = fail(c, tagpos, "module %s is empty", m.name);
		goto out_free;
	}
	if (len > TLM_SCHEMA_MAX_POS) {
		rc = fail(c, tagpos, "module %s: %llu positions, over %u", m.name,
			  (unsigned long long)len, TLM_SCHEMA_MAX_POS);
		goto out_free;
	}
	m.len = len;
	nm = realloc(s->mods, (s->nmods + 1) * sizeof(*nm));
	if (!nm) {
		rc = -ENOMEM;
		goto out_free;
	}
	s->mods = nm;
	s->mods[s->nmods++] = m;
	return 0;
out_free:
	free_module(&m);
	return rc;
}

/* Lay out start positions: file order, union members share a start. */
static int layout(struct cur *c)
{
	struct tlm_schema *s = c->s;
	uint64_t pos = 0;

	for (size_t k = 0; k < s->nmods;) {
		int u = s->mods[k].union_id;
		uint64_t longest = 0;
		size_t j = k;

		do {
			s->mods[j].start = pos;
			if (s->mods[j].len > longest)
				longest = s->mods[j].len;
			j++;
		} while (u >= 0 && j < s->nmods && s->mods[j].union_id == u);
		pos += longest;
		if (pos > TLM_SCHEMA_MAX_POS)
			return fail(c, c->n, "the modules need %llu positions, over %u",
				    (unsigned long long)pos, TLM_SCHEMA_MAX_POS);
		k = j;
	}
	s->end = pos;
	return 0;
}

static int schema_body(struct cur *c)
{
	struct attr a[4];
	int na, in, rc;
	bool empty;
	size_t tagpos;

	if ((rc = skip(c)))
		return rc;
	tagpos = c->i;
	if (!at(c, "<schema") || (c->i + 7 < c->n && name_char(c->b[c->i + 7])))
		return fail(c, c->i, "expected <schema name=\"...\">");
	c->i += 7;
	if ((rc = attrs(c, "schema", a, 4, &na, &empty)) ||
	    (rc = want_attrs(c, "schema", tagpos, a, na, "name", NULL, &in, NULL)))
		return rc;
	if (empty)
		return fail(c, tagpos, "<schema/> is empty: it needs modules");
	c->s->name = strdup(a[in].value);
	if (!c->s->name)
		return -ENOMEM;
	for (;;) {
		size_t p;

		if ((rc = skip(c)))
			return rc;
		p = c->i;
		if (c->i >= c->n)
			return fail(c, tagpos, "<schema> not closed (no </schema>)");
		if (at(c, "</schema>")) {
			c->i += 9;
			break;
		}
		if (at(c, "<module") && c->i + 7 < c->n && !name_char(c->b[c->i + 7])) {
			c->i += 7;
			if ((rc = module(c, p, -1)))
				return rc;
		} else if (at(c, "<union>")) {
			size_t before = c->s->nmods;
			int u = c->unions++;

			c->i += 7;
			for (;;) {
				if ((rc = skip(c)))
					return rc;
				p = c->i;
				if (c->i >= c->n)
					return fail(c, tagpos, "<union> not closed (no </union>)");
				if (at(c, "</union>")) {
					c->i += 8;
					break;
				}
				if (at(c, "<module") && c->i + 7 < c->n &&
				    !name_char(c->b[c->i + 7])) {
					c->i += 7;
					if ((rc = module(c, p, u)))
						return rc;
					continue;
				}
				return fail(c, p, c->b[p] == '<' ?
					    "a <union> holds only <module> elements" :
					    "text outside a module");
			}
			if (c->s->nmods == before)
				return fail(c, p, "empty <union>");
		} else {
			return fail(c, p, c->b[p] == '<' ?
				    "expected <module>, <union> or </schema>" :
				    "text outside a module");
		}
	}
	if ((rc = skip(c)))
		return rc;
	if (c->i < c->n)
		return fail(c, c->i, "text after </schema>");
	if (!c->s->nmods)
		return fail(c, tagpos, "schema %s has no modules", c->s->name);
	return layout(c);
}

void tlm_schema_free(struct tlm_schema *s)
{
	if (!s)
		return;
	for (size_t k = 0; k < s->nmods; k++)
		free_module(&s->mods[k]);
	free(s->mods);
	free(s->name);
	memset(s, 0, sizeof(*s));
}

int tlm_schema_parse(struct tlm_schema *s, const char *text, size_t len, const char *file,
		     char *err, size_t errlen)
{
	struct cur c = { .b = text, .n = len, .file = file ? file : "schema", .err = err,
			 .errlen = errlen, .s = s };
	uint64_t h = 0xcbf29ce484222325ull;
	int rc;

	memset(s, 0, sizeof(*s));
	if (!text && len)
		return -EINVAL;
	for (size_t k = 0; k < len; k++)
		h = (h ^ (unsigned char)text[k]) * 0x100000001b3ull;
	s->hash = h;
	rc = schema_body(&c);
	if (rc) {
		if (rc == -ENOMEM && err && errlen)
			snprintf(err, errlen, "%s: out of memory", c.file);
		tlm_schema_free(s);
	}
	return rc;
}

int tlm_schema_load(struct tlm_schema *s, const char *path, char *err, size_t errlen)
{
	struct stat st;
	char *buf;
	size_t got = 0;
	ssize_t r;
	int fd, rc;

	memset(s, 0, sizeof(*s));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return rc;
	}
	if (st.st_size > (16 << 20)) {
		snprintf(err, errlen, "%s: %lld bytes, over 16 MiB", path, (long long)st.st_size);
		close(fd);
		return -EFBIG;
	}
	buf = malloc(st.st_size + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	while (got < (size_t)st.st_size && (r = read(fd, buf + got, st.st_size - got)) > 0)
		got += r;
	close(fd);
	rc = tlm_schema_parse(s, buf, got, path, err, errlen);
	free(buf);
	return rc;
}

const struct tlm_module *tlm_schema_find(const struct tlm_schema *s, const char *name)
{
	for (size_t k = 0; s && name && k < s->nmods; k++)
		if (!strcmp(s->mods[k].name, name))
			return &s->mods[k];
	return NULL;
}
