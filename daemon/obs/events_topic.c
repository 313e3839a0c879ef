// SPDX-License-Identifier: MIT
/*
 * events_topic.c - the names KV events carry: the medium of a block,
 * the topic a namespace's batches go to (--kv-events-topic, with {host}
 * and {model}), and the checks of both settings.
 */
#include "events_int.h"

const char *kvd_medium_name(const struct kvd_ground *g, enum kvd_medium m)
{
	switch (m) {
	case KVD_MEDIUM_POOL:
		return g->h->pool_kind == KVSHM_POOL_CUDA ? "GPU" : g->cfg->kv_events_host_medium;
	case KVD_MEDIUM_SPILL:
		return "DISK";
	case KVD_MEDIUM_REMOTE:
		return "REMOTE";
	}
	return "UNKNOWN";
}

/* ------------------------------------------------------------- topics */

static bool topic_char(unsigned char c)
{
	return c >= 0x21 && c <= 0x7e;
}

int kvd_events_topic_check(const char *tmpl, const char **why)
{
	const char *p;

	if (strlen(tmpl) >= KVD_TOPIC) {
		*why = "longer than 127 bytes";
		return -EINVAL;
	}
	for (p = tmpl; *p; p++) {
		if (*p == '{') {
			if (strncmp(p, "{host}", 6) && strncmp(p, "{model}", 7)) {
				*why = "'{' must start {host} or {model}";
				return -EINVAL;
			}
			p = strchr(p, '}');
		} else if (*p == '}') {
			*why = "'}' without {host} or {model}";
			return -EINVAL;
		} else if (!topic_char((unsigned char)*p)) {
			*why = "only printable ASCII without spaces";
			return -EINVAL;
		}
	}
	return 0;
}

/* Append s to out (at *n, kvd_ev_room len - 1), made topic-safe. */
static void topic_put(char *out, size_t len, size_t *n, const char *s, bool clean)
{
	for (; *s && *n + 1 < len; s++)
		out[(*n)++] = !clean || (topic_char((unsigned char)*s) && *s != '@') ? *s : '_';
}

int kvd_events_topic(const char *tmpl, const char *host, const char *model, char *out,
		     size_t len)
{
	size_t n = 0;
	char one[2] = { 0, 0 };

	if (!len)
		return 0;
	while (*tmpl) {
		if (!strncmp(tmpl, "{host}", 6)) {
			topic_put(out, len, &n, host, true);
			tmpl += 6;
		} else if (!strncmp(tmpl, "{model}", 7)) {
			topic_put(out, len, &n, model, true);
			tmpl += 7;
		} else {
			one[0] = *tmpl++;
			topic_put(out, len, &n, one, false);
		}
	}
	out[n] = 0;
	return (int)n;
}

int kvd_events_medium_check(const char *name, const char **why)
{
	const char *p;

	if (!*name || strlen(name) >= KVD_MEDIUM) {
		*why = "must be 1..15 characters";
		return -EINVAL;
	}
	for (p = name; *p; p++)
		if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
		      (*p >= '0' && *p <= '9') || *p == '_' || *p == '-')) {
			*why = "only letters, digits, '_' and '-'";
			return -EINVAL;
		}
	return 0;
}
