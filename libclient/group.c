// SPDX-License-Identifier: MIT
/*
 * group.c - kvc_group: order a batch of prompts so that the ones sharing
 * a prefix run after the one that publishes it (see kvclient.h).
 *
 * A prompt is its sequence of full blocks (a trailing partial block is
 * never cached, so it cannot be shared). Sorting the batch by that
 * sequence, block by block, is a depth-first walk of the trie of blocks:
 * prompts with a common prefix end up next to each other, and the longest
 * common prefix of a prompt with any other is the longer of those with its
 * two neighbours. Prompts whose first block is equal form a group (they
 * share at least the root of a key chain). Pure computation: no handle, no
 * shared memory, no system call.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvclient.h"

struct batch {
	const uint32_t *const *p;
	const size_t *len;
	size_t bt;
};

static size_t blocks_of(const struct batch *b, size_t i)
{
	return b->len[i] / b->bt;
}

/* Common full blocks of prompts i and j. */
static size_t common_blocks(const struct batch *b, size_t i, size_t j)
{
	size_t n = blocks_of(b, i) < blocks_of(b, j) ? blocks_of(b, i) : blocks_of(b, j), k;

	for (k = 0; k < n; k++)
		if (memcmp(b->p[i] + k * b->bt, b->p[j] + k * b->bt, b->bt * sizeof(uint32_t)))
			break;
	return k;
}

static int cmp_first(const void *x, const void *y, void *ctx)
{
	const size_t *first = ctx, a = first[*(const size_t *)x], b = first[*(const size_t *)y];

	return a < b ? -1 : a > b;
}

static int cmp_prompt(const void *x, const void *y, void *ctx)
{
	const struct batch *b = ctx;
	size_t i = *(const size_t *)x, j = *(const size_t *)y;
	size_t bi = blocks_of(b, i), bj = blocks_of(b, j), n = bi < bj ? bi : bj;
	int c = n ? memcmp(b->p[i], b->p[j], n * b->bt * sizeof(uint32_t)) : 0;

	if (c)
		return c;
	if (bi != bj)
		return bi < bj ? -1 : 1;
	return i < j ? -1 : i > j;
}

int kvc_group(const uint32_t *const *prompts, const size_t *lens, size_t n,
	      size_t block_tokens, size_t *order, size_t *group_of)
{
	struct batch b = { prompts, lens, block_tokens };
	size_t *idx, *lcp, *grp, *first, *leader, *score, *rank, g = 0, k, o;

	if (!n)
		return 0;
	if (!prompts || !lens || !order || !block_tokens)
		return -EINVAL;
	if (n > (1u << 24))
		return -E2BIG;
	for (k = 0; k < n; k++) {
		if (lens[k] > KVC_MAX_TOKENS)
			return -E2BIG;
		if (!prompts[k] && lens[k])
			return -EINVAL;
	}
	idx = malloc(7 * n * sizeof(size_t));
	if (!idx)
		return -ENOMEM;
	lcp = idx + n;		/* lcp[s]: common blocks of sorted s-1 and s */
	grp = lcp + n;		/* group of input i (sorted-order numbering) */
	first = grp + n;	/* per group: earliest input index */
	leader = first + n;	/* per group: leader's input index */
	score = leader + n;	/* per group: the leader's shared blocks */
	rank = score + n;	/* sorted-order group number -> final number */
	for (k = 0; k < n; k++)
		idx[k] = k;
	qsort_r(idx, n, sizeof(size_t), cmp_prompt, &b);
	for (k = 0; k < n; k++) {
		size_t i = idx[k], shared;

		lcp[k] = k ? common_blocks(&b, idx[k - 1], i) : 0;
		if (!k || !lcp[k]) {
			first[g] = i;
			leader[g] = i;
			score[g] = 0;
			g++;
		}
		grp[i] = g - 1;
		if (i < first[g - 1])
			first[g - 1] = i;
		/* What i shares with its neighbours is what it can publish
		 * for the others (or reuse from them). */
		shared = lcp[k];
		if (k + 1 < n) {
			size_t next = common_blocks(&b, i, idx[k + 1]);

			if (next > shared)
				shared = next;
		}
		if (shared > score[g - 1] || (shared == score[g - 1] && i < leader[g - 1])) {
			score[g - 1] = shared;
			leader[g - 1] = i;
		}
	}
	/* Number the groups by their earliest prompt (lcp is free now). */
	for (k = 0; k < g; k++)
		lcp[k] = k;
	qsort_r(lcp, g, sizeof(size_t), cmp_first, first);
	for (k = 0; k < g; k++)
		rank[lcp[k]] = k;
	/* Leaders first, one per group, in group order; then the others,
	 * group by group, in trie order (the sorted order). */
	for (k = 0; k < g; k++)
		order[k] = leader[lcp[k]];
	for (k = 0; k < n; k++)	/* score: where each group starts in idx */
		if (!k || grp[idx[k]] != grp[idx[k - 1]])
			score[grp[idx[k]]] = k;
	o = g;
	for (k = 0; k < g; k++) {
		size_t sg = lcp[k], end = sg + 1 < g ? score[sg + 1] : n;

		for (size_t s = score[sg]; s < end; s++)
			if (idx[s] != leader[sg])
				order[o++] = idx[s];
	}
	if (group_of)
		for (k = 0; k < n; k++)
			group_of[k] = rank[grp[k]];
	free(idx);
	return g > INT32_MAX ? -E2BIG : (int)g;
}
