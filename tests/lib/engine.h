/* SPDX-License-Identifier: MIT */
/*
 * engine.h - a stand-in for an inference engine's paged KV cache, for the
 * tests of kvc_gather / kvc_scatter: host images of its per-layer tensors
 * in either layout, a KV pattern derived from each block's key (so any
 * process can write or check a block knowing only the prompt), and a
 * background pattern that shows any byte written where it should not be.
 * The GPU tests copy the same images to and from device memory.
 */
#ifndef KVT_ENGINE_H
#define KVT_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "../../libclient/kvclient.h"

struct kvt_engine {
	uint32_t kind;		/* KVC_LAYOUT_KV or KVC_LAYOUT_FLASH */
	uint32_t layers;
	uint64_t num_blocks;
	uint64_t half;		/* bytes of one block of one K or V tensor */
	uint64_t stride;	/* bytes between blocks (half + padding) */
	uint64_t tensor_bytes;	/* each allocation: k[l] (and v[l] for KV) */
	uint32_t kv_heads, head_dim, bt, dt;
	uint8_t **k, **v;	/* host images, [layers] */
};

/* Host images for model m, filled with the background. 0 or -ENOMEM. */
int kvt_engine_new(struct kvt_engine *e, const struct kvc_model *m, uint32_t kind,
		   uint64_t num_blocks, uint64_t pad);
void kvt_engine_free(struct kvt_engine *e);

/* Write key's pattern into engine block b (all layers, K and V). */
void kvt_engine_put(struct kvt_engine *e, uint64_t b, struct kvc_key key);
/* Does engine block b hold key's pattern, byte for byte? */
bool kvt_engine_has(const struct kvt_engine *e, uint64_t b, struct kvc_key key);
/* Does layer l of engine block b (K and V) hold key's pattern? */
bool kvt_engine_layer_has(const struct kvt_engine *e, uint64_t b, uint32_t l,
			  struct kvc_key key);
/* Does engine block b (with its padding) still hold the background? */
bool kvt_engine_untouched(const struct kvt_engine *e, uint64_t b);

/* A layout over tensors t_k[l] (and t_v[l]): the host images, or device
 * copies of them. */
struct kvc_layout kvt_engine_layout(const struct kvt_engine *e, void *const *t_k,
				    void *const *t_v);



/*
 * Where an engine's tensors live: NULL for the host images themselves;
 * the GPU tests give device copies. upload makes t_k/t_v (layers each)
 * hold the images' bytes; download copies them back into the images and
 * releases them; sync waits for the stream.
 */
struct kvt_mem {
	int (*upload)(const struct kvt_engine *e, void **t_k, void **t_v);
	int (*download)(struct kvt_engine *e, void **t_k, void **t_v);
	int (*sync)(void *stream);
	void *stream;
	/* A host pool's GPU engine: layouts carry KVC_LAYOUT_DEVICE and
	 * `device`; with `prepare`, kvc_gpu_prepare(device, prepare_flags)
	 * right after attaching. */
	bool device_layout;
	bool prepare;
	int device;
	uint32_t prepare_flags;
	/* The reader's gather, if not one kvc_gather (n blocks from 0). */
	int (*gather)(struct kvc_req *r, size_t n, const struct kvc_layout *l,
		      const int64_t *ids, void *stream);
};

/*
 * The writer's side: attach to `sock` with model m, look up the prompt
 * (expects no hit), allocate, write every block's pattern into an engine
 * of `kind` at scattered engine block ids, kvc_scatter it in two partial
 * runs, publish. Returns the cached blocks, or a negative code naming the
 * step that failed (-1000 - step).
 */
int kvt_engine_publish(const char *sock, const struct kvc_model *m, const uint32_t *t,
		       size_t n, uint32_t kind, const struct kvt_mem *mem);
/*
 * The reader's side: look up the prompt (expects every block to hit),
 * kvc_gather them all in one call into an engine of `kind` (padded
 * blocks, other scattered ids), and check every byte: each block's
 * pattern where it went, the background everywhere else. 0, or -1000 -
 * step.
 */
int kvt_engine_fetch(const char *sock, const struct kvc_model *m, const uint32_t *t,
		     size_t n, uint32_t kind, const struct kvt_mem *mem);
#endif
