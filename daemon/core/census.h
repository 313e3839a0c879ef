/* SPDX-License-Identifier: MIT */
/*
 * census.h - the pin census (census.c).
 */
#ifndef KVD_CENSUS_H
#define KVD_CENSUS_H

#include "kvd.h"

/* Pin slots of c's ledger naming a page right now (c's own word). */
uint32_t kvd_ledger_pins(const struct kvd *d, const struct kvd_client *c);
/* c holds pages: WRITING ones, or pins in its ledger. */
bool kvd_client_holds(const struct kvd *d, const struct kvd_client *c);
/* Count pinned pages and pins in use over all ledgers: a slice of at
 * most KVD_CENSUS_SLICE slots (and rows) per call, a pass at most every
 * 5 ticks; the totals are published when a pass ends. */
#define KVD_CENSUS_SLICE 16384u
void kvd_pin_census(struct kvd *d);

#endif
