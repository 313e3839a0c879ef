/* SPDX-License-Identifier: MIT */
/*
 * spill_slot.h - the on-disk format of the spill area.
 *
 * DIR/kvcached-spill-NNN.slots, each file:
 *
 *   [file header, 4096 bytes][slot 0][slot 1]...
 *   slot = [slot header, hdr_bytes][payload, page_bytes]
 *
 * hdr_bytes and page_bytes are multiples of 4096, so every I/O is aligned
 * for O_DIRECT. A slot header names the block completely (namespace
 * identity, key, parent key, tokens) and carries two XXH3-64 checksums:
 * one of the header itself and one of the payload. A slot whose magic is
 * zero is empty. Everything here is pure (no I/O), so the parsers can be
 * fuzzed; the daemon reads every header through kvd_slot_hdr_check.
 */
#ifndef KVD_SPILL_SLOT_H
#define KVD_SPILL_SLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../shm/segment.h"

#define KVD_AREA_MAGIC   0x41455241504b564bull	/* "KVKPAREA" */
#define KVD_SLOT_MAGIC   0x314c4c495053564bull	/* "KVSPILL1" */
/* 2: block keys carry their chain's root (shm/key.h): a file of version 1
 * holds blocks under keys no lookup computes any more, and starts empty;
 * the namespace identity of segment layout 16 (no tensor-parallel rank;
 * stage, layout). */
#define KVD_SPILL_VERSION 2u
#define KVD_SPILL_ALIGN  4096u

struct kvd_area_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t block_tokens;
	uint64_t hdr_bytes;	/* slot header bytes */
	uint64_t page_bytes;	/* slot payload bytes (the pool page) */
	uint64_t slots;		/* slots in this file */
	uint64_t clean;		/* 1: the daemon shut down cleanly; 0 while
				 * it runs (slots check themselves either way) */
	uint64_t check;		/* XXH3-64 of the fields above */
};

struct kvd_slot_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t block_tokens;
	uint64_t seq;		/* write order: the newer copy of a key wins */
	struct kvshm_key key;
	struct kvshm_key parent;
	uint64_t payload_bytes;	/* the namespace's page bytes */
	uint64_t payload_check;	/* XXH3-64 of the payload */
	struct kvshm_ns ns;	/* namespace identity (`used` is 0 on disk) */
	uint64_t check;		/* XXH3-64 of this header and the tokens,
				 * with this field zero */
	/* uint32_t tokens[block_tokens] follow */
};

/* Bytes of a slot header for blocks of bt tokens (4096-aligned). */
uint64_t kvd_slot_hdr_bytes(uint32_t bt);

/* Fill the area header; check one read from disk: 0, or -EBADMSG with
 * *why set when it is not for this geometry. */
void kvd_area_hdr_fill(struct kvd_area_hdr *a, uint32_t bt, uint64_t hdr_bytes,
		       uint64_t page_bytes, uint64_t slots, bool clean);
int kvd_area_hdr_check(const void *buf, size_t len, uint32_t bt, uint64_t hdr_bytes,
		       uint64_t page_bytes, uint64_t slots, const char **why);

/* XXH3-64 of a payload. */
uint64_t kvd_payload_check(const void *p, size_t len);

/*
 * Write a slot header into buf (hdr_bytes, zero-filled past the tokens).
 */
void kvd_slot_hdr_fill(void *buf, uint64_t hdr_bytes, uint64_t seq,
		       const struct kvshm_ns *ns, struct kvshm_key key,
		       struct kvshm_key parent, const uint32_t *tokens,
		       uint32_t bt, uint64_t payload_bytes, uint64_t payload_check);

/*
 * Check a slot header read from disk (len bytes at buf) for a pool with
 * bt-token blocks and page_bytes-byte slots. Returns 1 for an empty slot
 * (magic zero), 0 for a valid header (its namespace identity checked the
 * way a HELLO is: sizes, name, id), or -EBADMSG with *why naming the
 * problem.
 */
int kvd_slot_hdr_check(const void *buf, size_t len, uint32_t bt, uint64_t page_bytes,
		       const char **why);

#endif
