// SPDX-License-Identifier: MIT
/*
 * config_value.c - reading one setting's value: sizes, numbers, endpoints,
 * listen addresses, user and group lists, and the settings whose value
 * options[] (config.c) cannot read by its type alone (kvd_value_*).
 *
 * Nothing here knows the table or where a value came from; a bad value is
 * answered with 1 and *why, which config.c turns into the message.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../shm/proto.h"
#include "../shm/segment.h"
#include "config_value.h"
#include "obs/events.h"
#include "pool/memcheck.h"
#include "../fmt/remote_item.h"

#define KVD_STR_(x) #x
#define KVD_STR(x) KVD_STR_(x)

int kvd_parse_size(const char *s, uint64_t *out)
{
	unsigned long long v;
	uint64_t mul = 1;
	char *end;

	if (!s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -EINVAL;
	switch (toupper((unsigned char)*end)) {
	case 0: break;
	case 'K': mul = 1ull << 10; end++; break;
	case 'M': mul = 1ull << 20; end++; break;
	case 'G': mul = 1ull << 30; end++; break;
	case 'T': mul = 1ull << 40; end++; break;
	default: return -EINVAL;
	}
	if (mul > 1 && (!strcasecmp(end, "iB") || !strcasecmp(end, "B")))
		end += strlen(end);
	if (*end || (v && mul > UINT64_MAX / v))
		return -EINVAL;
	*out = v * mul;
	return 0;
}

int kvd_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out, int base)
{
	unsigned long v;
	char *end;

	if (!s || !*s || *s == '-' || isspace((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, base);
	if (errno || *end || v < lo || v > hi)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

int kvd_endpoint_check(const char *s)
{
	bool tcp = !strncmp(s, "tcp://", 6);
	const char *rest = s + 6, *colon;
	uint32_t port;
	size_t i;

	if ((!tcp && strncmp(s, "ipc://", 6)) || !*rest || strlen(s) >= KVD_ENDPOINT)
		return -EINVAL;
	for (i = 0; s[i]; i++)
		if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
			return -EINVAL;
	if (!tcp)
		return 0;
	/* HOST:PORT, HOST may be * or [v6]. */
	colon = strrchr(rest, ':');
	if (!colon || colon == rest || kvd_parse_u32(colon + 1, 0, 65535, &port, 10))
		return -EINVAL;
	return 0;
}

int kvd_parse_listen(const char *s, struct sockaddr_storage *out)
{
	char host[64];
	const char *colon, *h = s;
	size_t hl;
	uint32_t port;

	memset(out, 0, sizeof(*out));
	if (*s == '[') {
		const char *rb = strchr(s, ']');

		if (!rb || rb[1] != ':')
			return -EINVAL;
		h = s + 1;
		hl = (size_t)(rb - h);
		colon = rb + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon)
			return -EINVAL;
		hl = (size_t)(colon - s);
	}
	if (!hl || hl >= sizeof(host) || kvd_parse_u32(colon + 1, 0, 65535, &port, 10))
		return -EINVAL;
	memcpy(host, h, hl);
	host[hl] = 0;
	if (*s == '[') {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)out;

		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)port);
		return inet_pton(AF_INET6, host, &a->sin6_addr) == 1 ? 0 : -EINVAL;
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)out;

		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)port);
		return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : -EINVAL;
	}
}

/* An allow list: 0, or 1 with *why naming the entry at fault. */
static int parse_ids(const char *val, bool users, struct kvd_config *cfg, const char **why)
{
	static char msg[160];	/* *why's text; the parse is single-threaded */
	char buf[1024], *save = NULL, *tok;
	int n = 0;

	if (strlen(val) >= sizeof(buf)) {
		*why = "longer than 1023 bytes";
		return 1;
	}
	strcpy(buf, val);
	for (tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
		uint32_t id;

		if (n == KVD_MAX_ALLOW) {
			*why = "more than " KVD_STR(KVD_MAX_ALLOW) " entries";
			return 1;
		}
		if (kvd_parse_u32(tok, 0, UINT32_MAX - 1, &id, 10)) {
			struct passwd *pw = users ? getpwnam(tok) : NULL;
			struct group *gr = users ? NULL : getgrnam(tok);

			if (!pw && !gr) {
				snprintf(msg, sizeof(msg), "no such %s '%.100s'",
					 users ? "user" : "group", tok);
				*why = msg;
				return 1;
			}
			id = users ? pw->pw_uid : gr->gr_gid;
		}
		if (users)
			cfg->allow_uid[n++] = id;
		else
			cfg->allow_gid[n++] = id;
	}
	if (users)
		cfg->n_allow_uid = n;
	else
		cfg->n_allow_gid = n;
	return 0;
}

/* ------------------------------------------------------------ values
 * The parsers of the table's CUSTOM rows: 0, 1 with *why naming the
 * problem, or -1 after printing their own message. */

int kvd_value_socket(struct kvd_config *cfg, const char *val, const char *where,
		     const char **why)
{
	(void)where;
	if (!*val || strlen(val) >= sizeof(cfg->socket)) {
		*why = "empty, or longer than 107 bytes";
		return 1;
	}
	strcpy(cfg->socket, val);
	return 0;
}

int kvd_value_pool(struct kvd_config *cfg, const char *val, const char *where,
		   const char **why)
{
	(void)where;
	if (strcmp(val, "host") && strcmp(val, "cuda")) {
		*why = "must be host or cuda";
		return 1;
	}
	strcpy(cfg->pool, val);
	return 0;
}

int kvd_value_pool_size(struct kvd_config *cfg, const char *val, const char *where,
			const char **why)
{
	size_t l = strlen(val);

	(void)where;
	if (l > 1 && val[l - 1] == '%') {
		char num[16];

		*why = "a share must be 1%..100%";
		if (l - 1 >= sizeof(num))
			return 1;
		memcpy(num, val, l - 1);
		num[l - 1] = 0;
		if (kvd_parse_u32(num, 1, 100, &cfg->pool_share, 10))
			return 1;
	} else {
		if (kvd_parse_size(val, &cfg->pool_size)) {
			*why = "not a size (a number with an optional K, M, G or T suffix, or a share such as 40%)";
			return 1;
		}
		cfg->pool_share = 0;
	}
	return 0;
}

int kvd_value_metrics_listen(struct kvd_config *cfg, const char *val, const char *where,
			     const char **why)
{
	(void)where;
	if (!*val) {
		cfg->metrics_listen[0] = 0;	/* off */
		return 0;
	}
	if (strlen(val) >= sizeof(cfg->metrics_listen) ||
	    kvd_parse_listen(val, &cfg->metrics_addr)) {
		*why = "must be IP:PORT, e.g. 127.0.0.1:9464 or [::1]:9464";
		return 1;
	}
	strcpy(cfg->metrics_listen, val);
	return 0;
}

int kvd_value_topic(struct kvd_config *cfg, const char *val, const char *where,
		    const char **why)
{
	(void)where;
	if (kvd_events_topic_check(val, why))
		return 1;
	strcpy(cfg->kv_events_topic, val);
	return 0;
}

int kvd_value_host_medium(struct kvd_config *cfg, const char *val, const char *where,
			  const char **why)
{
	(void)where;
	if (kvd_events_medium_check(val, why))
		return 1;
	strcpy(cfg->kv_events_host_medium, val);
	return 0;
}

int kvd_value_remote(struct kvd_config *cfg, const char *val, const char *where,
		     const char **why)
{
	struct kvd_rserver sv[KVD_REMOTE_MAX_SERVERS];
	unsigned n;

	(void)where;
	if (!*val) {
		cfg->remote[0] = 0;	/* none */
		return 0;
	}
	if (strlen(val) >= sizeof(cfg->remote)) {
		*why = "longer than 2047 bytes";
		return 1;
	}
	if (kvd_remote_parse(val, sv, KVD_REMOTE_MAX_SERVERS, &n, why))
		return 1;
	strcpy(cfg->remote, val);
	return 0;
}

int kvd_value_remote_prefix(struct kvd_config *cfg, const char *val, const char *where,
			    const char **why)
{
	(void)where;
	if (!kvd_rval_prefix_ok(val)) {
		*why = "must be 1..63 letters, digits, '.', '_' or '-'";
		return 1;
	}
	strcpy(cfg->remote_prefix, val);
	return 0;
}

int kvd_value_users(struct kvd_config *cfg, const char *val, const char *where,
		    const char **why)
{
	(void)where;
	return parse_ids(val, true, cfg, why);
}

int kvd_value_groups(struct kvd_config *cfg, const char *val, const char *where,
		     const char **why)
{
	(void)where;
	return parse_ids(val, false, cfg, why);
}

/*
 * tenant = NAME [salt=TEXT | salt-hex=HEX] [share=PCT] [no-insert]: the
 * clients of that salt (none: the unsalted ones) are tenant NAME in kvstat
 * and the metrics, held to PCT% of the pool (else tenant-share), and
 * no-insert ones never publish. A line per tenant; a NAME given again
 * replaces its line.
 */
int kvd_value_tenant(struct kvd_config *cfg, const char *val, const char *where,
		     const char **why)
{
	struct kvd_tenant_cfg t;
	char buf[1024], *save = NULL, *tok;
	uint32_t i;
	size_t n;

	memset(&t, 0, sizeof(t));
	if (strlen(val) >= sizeof(buf)) {
		*why = "longer than 1023 bytes";
		return 1;
	}
	strcpy(buf, val);
	tok = strtok_r(buf, " \t", &save);
	n = tok ? strlen(tok) : 0;
	if (!n || n >= sizeof(t.name) || strchr(tok, '=') ||
	    strspn(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != n) {
		*why = "must start with a name of 1..31 letters, digits, '.', '_' or '-' (then salt=, salt-hex=, share=, no-insert)";
		return 1;
	}
	memcpy(t.name, tok, n);
	while ((tok = strtok_r(NULL, " \t", &save))) {
		if (!strncmp(tok, "salt=", 5)) {
			n = strlen(tok + 5);
			if (!n || n > sizeof(t.salt)) {
				*why = "salt= takes 1..256 bytes";
				return 1;
			}
			memcpy(t.salt, tok + 5, n);
			t.salt_len = (uint32_t)n;
		} else if (!strncmp(tok, "salt-hex=", 9)) {
			const char *h = tok + 9;

			n = strlen(h);
			if (!n || n % 2 || n / 2 > sizeof(t.salt) ||
			    strspn(h, "0123456789abcdefABCDEF") != n) {
				*why = "salt-hex= takes 1..256 bytes as pairs of hex digits";
				return 1;
			}
			for (i = 0; i < n / 2; i++) {
				char two[3] = { h[2 * i], h[2 * i + 1], 0 };

				t.salt[i] = (uint8_t)strtoul(two, NULL, 16);
			}
			t.salt_len = (uint32_t)(n / 2);
		} else if (!strncmp(tok, "share=", 6)) {
			char num[16];

			n = strlen(tok + 6);
			if (n && tok[6 + n - 1] == '%')
				n--;
			if (!n || n >= sizeof(num)) {
				*why = "share= must be a percentage 1..100 (50 or 50%)";
				return 1;
			}
			memcpy(num, tok + 6, n);
			num[n] = 0;
			if (kvd_parse_u32(num, 1, 100, &t.share, 10)) {
				*why = "share= must be a percentage 1..100 (50 or 50%)";
				return 1;
			}
		} else if (!strcmp(tok, "no-insert")) {
			t.no_insert = true;
		} else {
			*why = "unknown word (salt=, salt-hex=, share=, no-insert)";
			return 1;
		}
	}
	for (i = 0; i < cfg->n_tenants; i++)
		if (!strcmp(cfg->tenants[i].name, t.name))
			break;
	if (i == KVD_MAX_TENANTS) {
		*why = "more than 32 tenants";
		return 1;
	}
	snprintf(t.where, sizeof(t.where), "%s", *where ? where : "--");
	cfg->tenants[i] = t;
	if (i == cfg->n_tenants)
		cfg->n_tenants++;
	return 0;
}

int kvd_parse_bool(const char *val, bool *out)
{
	if (!strcmp(val, "") || !strcmp(val, "true") || !strcmp(val, "yes") || !strcmp(val, "1"))
		*out = true;
	else if (!strcmp(val, "false") || !strcmp(val, "no") || !strcmp(val, "0"))
		*out = false;
	else
		return -EINVAL;
	return 0;
}

