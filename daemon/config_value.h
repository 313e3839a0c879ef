/* SPDX-License-Identifier: MIT */
/*
 * config_value.h - reading one setting's value (config_value.c), for
 * options[] in config.c. The kvd_value_* functions are the rows' custom
 * readers: 0, or 1 with *why set to what the message says.
 */
#ifndef KVD_CONFIG_VALUE_H
#define KVD_CONFIG_VALUE_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"

/* A number lo..hi in `base` (8 or 10), the whole string: 0 or -EINVAL. */
int kvd_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out, int base);
/* true/yes/1/"" or false/no/0: 0 or -EINVAL. */
int kvd_parse_bool(const char *val, bool *out);

int kvd_value_socket(struct kvd_config *cfg, const char *val, const char *where,
		     const char **why);
int kvd_value_pool(struct kvd_config *cfg, const char *val, const char *where,
		   const char **why);
int kvd_value_pool_size(struct kvd_config *cfg, const char *val, const char *where,
			const char **why);
int kvd_value_metrics_listen(struct kvd_config *cfg, const char *val, const char *where,
			     const char **why);
int kvd_value_topic(struct kvd_config *cfg, const char *val, const char *where,
		    const char **why);
int kvd_value_host_medium(struct kvd_config *cfg, const char *val, const char *where,
			  const char **why);
int kvd_value_remote(struct kvd_config *cfg, const char *val, const char *where,
		     const char **why);
int kvd_value_remote_prefix(struct kvd_config *cfg, const char *val, const char *where,
			    const char **why);
int kvd_value_users(struct kvd_config *cfg, const char *val, const char *where,
		    const char **why);
int kvd_value_groups(struct kvd_config *cfg, const char *val, const char *where,
		     const char **why);
/* One tenant line (replaces an earlier line of the same name). */
int kvd_value_tenant(struct kvd_config *cfg, const char *val, const char *where,
		     const char **why);

#endif
