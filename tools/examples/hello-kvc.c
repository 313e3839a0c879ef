/* hello-kvc.c */
#include <stdio.h>
#include <kvclient.h>

int main(void)
{
	struct kvc_model m = { .size = sizeof(m), .name = "llama-3-8b@main", .dtype_bytes = 2,
			       .layers = 32, .kv_heads = 8, .head_dim = 128, .block_tokens = 16,
			       .pos_kind = KVC_POS_ROPE };
	kvc_t *c;
	int rc = kvc_open(&m, NULL, &c);

	printf("libkvclient %s (%d): %s\n", kvc_version_string(), kvc_version(),
	       rc ? kvc_strerror(rc) : "attached");
	kvc_close(rc ? NULL : c);
	return rc ? 1 : 0;
}
