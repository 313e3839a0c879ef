/* SPDX-License-Identifier: MIT */
/*
 * reload.h - applying changed settings to a running daemon (reload.c).
 */
#ifndef KVD_RELOAD_H
#define KVD_RELOAD_H

#include "core/kvd.h"

/* SIGHUP: read the settings again (d->argc, d->argv) and apply the ones
 * that can change live; the log names what was applied and what needs a
 * restart. */
void kvd_reload(struct kvd *d);
/* The settings in force into the segment (kvstat shows them). */
void kvd_reload_publish(struct kvd *d);

#endif
