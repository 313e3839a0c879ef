/* SPDX-License-Identifier: MIT */
/*
 * registry.h - attached clients: HELLO, STAT, POOL, their end, the tick (registry.c).
 */
#ifndef KVD_REGISTRY_H
#define KVD_REGISTRY_H

#include "reply.h"

/* HELLO (a second one is refused). */
kvd_frame_fn kvd_registry_hello;
/*
 * The client's connection ends. After a BYE (bye = true), or when its
 * process is gone, everything it held is released at once. Otherwise (a
 * protocol violation, or a hang-up from a process that lives on) its ledger
 * keeps counting and its WRITING pages stay its own until its pidfd says
 * the process exited: its threads may still be reading pinned pages.
 */
void kvd_registry_drop(struct kvd *d, struct kvd_client *c, const char *why);
/* POOL: a cuda pool's chunk fds for an attached client (-1: closing). */
kvd_frame_fn kvd_registry_pool;
void kvd_registry_bye(struct kvd *d, struct kvd_client *c);
/* The lingering client's process exited: release everything. */
void kvd_registry_exited(struct kvd *d, struct kvd_client *c);
/* STAT: hand an observer the segment fd, then end it. Returns -1. */
kvd_frame_fn kvd_registry_stat;
void kvd_registry_tick(struct kvd *d);

#endif
