/* The fuzz target, the cases: one mha_attention call or one layer
 * (create, then forward) per input, and the libFuzzer entry point. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "terms.h"

const char *const tensor_names[4] = {"q", "k", "v", "out"};

void describe_tensor(char *s, size_t n, const char *name,
                            const mha_tensor *t)
{
    snprintf(s, n, " %s[%lld,%lld,%lld,%lld|%lld,%lld,%lld|%d%s]", name,
             (long long)t->batch, (long long)t->seq, (long long)t->heads,
             (long long)t->dim, (long long)t->stride_batch,
             (long long)t->stride_seq, (long long)t->stride_head,
             (int)t->dtype, t->data ? "" : " NULL");
}

void describe_attention(const attention_case *c, const char *engine,
                               const fault_list *f, int huge)
{
    char part[4][128];
    const mha_tensor *t[4] = {&c->args.q, &c->args.k, &c->args.v,
                              &c->args.out};
    for (int i = 0; i < 4; i++)
        describe_tensor(part[i], sizeof part[i], tensor_names[i], t[i]);
    const mha_mask *m = &c->mask;
    snprintf(context, sizeof context,
             "attention %s%s%s%s%s scale=%g weights=%d alias=%d mask=%d{"
             "causal=%d keep=%d[%lld,%lld,%lld] bias=%d[%lld,%lld,%lld] "
             "lengths=%d(mode %u)} faults=%d%s%s%s",
             engine, part[0], part[1], part[2], part[3],
             (double)c->args.scale, c->want_weights, c->alias, c->mb.use,
             (int)m->causal, c->mb.keep, (long long)m->keep_stride_batch,
             (long long)m->keep_stride_head,
             (long long)m->keep_stride_query, c->mb.bias,
             (long long)m->bias_stride_batch, (long long)m->bias_stride_head,
             (long long)m->bias_stride_query, c->mb.lengths,
             c->mreq.len_mode % 8, f->n, f->n ? " (" : "",
             f->n ? f->why[0] : "", f->n ? ")" : huge ? " huge" : "");
}

/* Halves the largest of the lengths and depths until the oracle's work
 * and every buffer fit the budgets: the sizes stay valid, only smaller. */
void fit_attention(int64_t B, int64_t H, int64_t Hkv, int64_t *Lq,
                          int64_t *Lk, int64_t *d, int64_t *dv)
{
    int64_t *dims[4] = {Lq, Lk, d, dv};
    for (;;) {
        int64_t depth = *d > *dv ? *d : *dv;
        if ((wide)B * H * *Lq * *Lk * (*d + *dv) <= MAX_WORK &&
            (wide)B * H * *Lq * depth <= MAX_ELEMS / 2 &&
            (wide)B * Hkv * *Lk * depth <= MAX_ELEMS / 2 &&
            (wide)B * H * *Lq * *Lk <= MAX_ELEMS / 2)
            return;
        int big = 0;
        for (int i = 1; i < 4; i++)
            if (*dims[i] > *dims[big])
                big = i;
        *dims[big] = (*dims[big] + 1) / 2;
    }
}

void alloc_attention(attention_case *c)
{
    mha_attention_args *a = &c->args;
    mha_tensor *t[4] = {&a->q, &a->k, &a->v, &a->out};
    size_t need[NBUF];
    int huge = 0;
    for (int i = 0; i < 4; i++)
        need[i] = alloc_bytes(tensor_span(t[i]), elem_size(t[i]->dtype),
                              &huge);
    const int64_t wdims[4] = {a->q.batch, a->q.heads, a->q.seq, a->k.seq};
    need[B_W] = c->want_weights ? alloc_bytes(product(wdims, 4), 4, &huge) : 4;
    /* An aliased pair shares the larger buffer. */
    int from = -1, to = -1;
    switch (c->alias) {
    case 10: from = B_K, to = B_Q; break; /* k and v inside q: valid */
    case 11: from = B_OUT, to = B_Q; break;
    case 12: from = B_OUT, to = B_V; break;
    case 13: from = c->want_weights ? B_W : -1, to = B_OUT; break;
    case 14: from = c->want_weights ? B_W : -1, to = B_K; break;
    default: break;
    }
    if (from >= 0) {
        if (need[from] > need[to])
            need[to] = need[from];
        if (c->alias == 10 && need[B_V] > need[to])
            need[to] = need[B_V];
    }
    for (int i = 0; i < NBUF; i++)
        buffer_alloc(&c->buf[i], need[i], (c->misalign >> i) & 1 ? 4 : 0);
    alloc_mask(&c->mask, &c->mb, a->q.batch, a->q.heads, a->q.seq, a->k.seq,
               c->misalign >> 5);
    grow_for_mask_alias(c->alias, &c->mb, &c->buf[B_OUT]);
}

/* Points the arguments at the buffers (after filling them). */
void link_attention(attention_case *c)
{
    mha_attention_args *a = &c->args;
    mha_tensor *t[4] = {&a->q, &a->k, &a->v, &a->out};
    for (int i = 0; i < 4; i++)
        if (t[i]->data)
            t[i]->data = c->buf[i].data;
    switch (c->alias) {
    case 10:
        if (a->k.data)
            a->k.data = c->buf[B_Q].data;
        if (a->v.data)
            a->v.data = c->buf[B_Q].data;
        break;
    case 11: if (a->out.data) a->out.data = c->buf[B_Q].data; break;
    case 12: if (a->out.data) a->out.data = c->buf[B_V].data; break;
    default: break;
    }
    a->weights = NULL;
    if (c->want_weights)
        a->weights = (float *)(c->alias == 13   ? c->buf[B_OUT].data
                               : c->alias == 14 ? c->buf[B_K].data
                                                : c->buf[B_W].data);
    link_mask(&c->mb, &c->mask);
    alias_mask_into(c->alias, &c->mb, &c->mask, c->buf[B_OUT].data);
    a->mask = c->mb.use ? &c->mask : NULL;
}

/* Bytes after the engine's: dims (7), layouts (4 x 4), flags, misalign,
 * alias, scale (6), mask (11), seed (4), dtypes of k and v, specials (33),
 * corruptions, then the terms, lse and scales (14, terms.c). */
void fuzz_attention(byte_reader *in, mha_engine *engine,
                           const char *engine_desc)
{
    attention_case c;
    memset(&c, 0, sizeof c);
    int64_t B = 1 + take8(in) % 3, Lq = seq_of(take8(in)), Lk = seq_of(take8(in));
    int64_t Hkv = 1 + take8(in) % 3, H = Hkv * (1 + take8(in) % 4);
    int64_t d = 1 + take8(in) % 72, dv = 1 + take8(in) % 72;
    fit_attention(B, H, Hkv, &Lq, &Lk, &d, &dv);
    const int64_t sizes[4][4] = {{B, Lq, H, d}, {B, Lk, Hkv, d},
                                 {B, Lk, Hkv, dv}, {B, Lq, H, dv}};
    mha_tensor *t[4] = {&c.args.q, &c.args.k, &c.args.v, &c.args.out};
    for (int i = 0; i < 4; i++) {
        t[i]->batch = sizes[i][0], t[i]->seq = sizes[i][1];
        t[i]->heads = sizes[i][2], t[i]->dim = sizes[i][3];
        t[i]->dtype = MHA_F32;
        t[i]->data = &c; /* non-NULL until a corruption clears it */
        layout_strides(in, t[i]);
    }
    c.want_weights = take8(in) & 1;
    c.misalign = take8(in);
    c.alias = (int)(take8(in) % 16);
    c.args.scale = take_scale(in, d);
    parse_mask(in, &c.mreq);
    mask_presence(&c.mreq, &c.mb);
    build_mask(&c.mreq, H, Lq, Lk, &c.mask);
    c.seed = take32(in);
    unsigned dtypes = take8(in);
    c.args.k.dtype = dtype_of(dtypes);
    c.args.v.dtype = dtype_of(dtypes >> 3);
    special_request sp;
    parse_specials(in, &sp);
    corrupt_attention(in, &c);
    terms_case tc;
    parse_terms(in, &tc, &c);

    fault_list f = {0};
    int huge = 0;
    attention_model(&c, engine, &f, &huge);
    terms_model(&tc, &c, &f, &huge);
    describe_attention(&c, engine_desc, &f, huge);
    terms_describe(&tc, &c);
    if ((f.n == 0 && huge) || c.mb.lengths_unreadable || tc.unreadable) {
        stats[S_ATTN_SKIP]++;
        return;
    }

    alloc_attention(&c);
    buffer_fill_sentinel(&c.buf[B_OUT]);
    buffer_fill_sentinel(&c.buf[B_W]);
    const mha_dtype vt[4] = {MHA_F32, c.args.k.dtype, c.args.v.dtype,
                             MHA_F32};
    for (int i = 0; i < 3; i++)
        fill_values(&c.buf[i], vt[i], c.seed * 3ull + (uint64_t)i);
    if (c.mb.use)
        fill_mask(&c.mreq, &c.mb, c.args.k.seq, c.seed);
    int shared = c.alias == 10;
    buffer *targets[4] = {&c.buf[B_Q], &c.buf[shared ? B_Q : B_K],
                          &c.buf[shared ? B_Q : B_V],
                          c.mb.bias ? &c.mb.buf[1] : NULL};
    inject_specials(&sp, targets, vt);
    link_attention(&c);
    terms_link(&tc, &c, &f);
    length_faults(&c.mb, &c.mask, c.args.q.batch, c.args.k.seq, &f);
    describe_attention(&c, engine_desc, &f, huge);
    terms_describe(&tc, &c);
    announce();
    if (f.n == 0 && huge) {
        stats[S_ATTN_SKIP]++;
        goto done;
    }
    stats[f.n ? S_ATTN_FAULT : S_ATTN_OK]++;
    snapshot_all(c.buf, NBUF, &c.mb);
    terms_snapshot(&tc);
    mha_status st = mha_attention(c.null_engine ? NULL : engine,
                                  c.null_args ? NULL : &c.args);
    int ok = check_call(st, &f, huge, c.buf, NBUF, &c.mb);
    terms_check_unchanged(&tc, !ok);
    if (ok)
        check_attention_outputs(&c);
done:
    terms_free(&tc);
    for (int i = 0; i < NBUF; i++)
        buffer_free(&c.buf[i]);
    for (int i = 0; i < 3; i++)
        buffer_free(&c.mb.buf[i]);
}

void fit_layer(layer_case *c)
{
    const int64_t E = c->desc.embed_dim, H = c->desc.num_heads;
    const int64_t kd = eff_kdim(&c->desc), vd = eff_vdim(&c->desc);
    for (;;) {
        wide B = c->B, Lq = c->Lq, Lk = c->Lk;
        wide work = B * (Lq * E * E * 2 + Lk * E * (kd + vd)) +
                    B * Lq * Lk * E * 2;
        wide widest = E > kd ? (E > vd ? E : vd) : (kd > vd ? kd : vd);
        wide most = (Lq > Lk ? Lq : Lk) * B * widest;
        if (work <= MAX_WORK && most <= MAX_ELEMS / 2 &&
            B * H * Lq * Lk <= MAX_ELEMS / 2)
            return;
        int64_t *big = c->Lq >= c->Lk ? &c->Lq : &c->Lk;
        *big = (*big + 1) / 2;
    }
}

void describe_layer(const layer_case *c, const char *engine,
                           const char *stage, const fault_list *f, int huge)
{
    const mha_layer_desc *d = &c->desc;
    const mha_mask *m = &c->mask;
    snprintf(context, sizeof context,
             "layer(%s) %s E=%lld H=%lld kdim=%lld vdim=%lld form=%d "
             "in_bias=%d out_bias=%d out_w=%s B=%lld Lq=%lld Lk=%lld "
             "null=%d%d%d%d%d weights=%d alias=%d mask=%d{causal=%d keep=%d"
             "[%lld,%lld,%lld] bias=%d[%lld,%lld,%lld] lengths=%d(mode %u)} "
             "faults=%d%s%s%s",
             stage, engine, (long long)d->embed_dim, (long long)d->num_heads,
             (long long)d->kdim, (long long)d->vdim, c->form,
             d->in_proj_bias != NULL, d->out_proj_bias != NULL,
             c->null_out_w ? "NULL" : "set", (long long)c->B,
             (long long)c->Lq, (long long)c->Lk, c->null_layer,
             c->null_in[0], c->null_in[1], c->null_in[2], c->null_in[3],
             c->want_weights, c->alias, c->mb.use, (int)m->causal, c->mb.keep,
             (long long)m->keep_stride_batch, (long long)m->keep_stride_head,
             (long long)m->keep_stride_query, c->mb.bias,
             (long long)m->bias_stride_batch, (long long)m->bias_stride_head,
             (long long)m->bias_stride_query, c->mb.lengths,
             c->mreq.len_mode % 8, f->n, f->n ? " (" : "",
             f->n ? f->why[0] : "", f->n ? ")" : huge ? " huge" : "");
}

void alloc_layer(layer_case *c)
{
    const mha_layer_desc *d = &c->desc;
    const int64_t dims[NLBUF][4] = {
        {c->B, c->Lq, d->embed_dim, 1}, {c->B, c->Lk, eff_kdim(d), 1},
        {c->B, c->Lk, eff_vdim(d), 1},  {c->B, c->Lq, d->embed_dim, 1},
        {c->B, d->num_heads, c->Lq, c->Lk}};
    size_t need[NLBUF];
    int huge = 0;
    for (int i = 0; i < NLBUF; i++)
        need[i] = alloc_bytes(product(dims[i], 4), 4, &huge);
    int to = c->alias == 10   ? L_QUERY
             : c->alias == 11 ? L_QUERY
             : c->alias == 12 ? L_VALUE
             : c->alias == 13 ? L_OUT
             : c->alias == 14 ? L_KEY
                              : -1;
    for (int i = 0; to >= 0 && i < NLBUF; i++)
        if (need[i] > need[to])
            need[to] = need[i];
    for (int i = 0; i < NLBUF; i++)
        buffer_alloc(&c->buf[i], need[i], (c->misalign >> i) & 1 ? 4 : 0);
    alloc_mask(&c->mask, &c->mb, c->B, d->num_heads, c->Lq, c->Lk,
               c->misalign >> 5);
    grow_for_mask_alias(c->alias, &c->mb, &c->buf[L_OUT]);
}

layer_pointers link_layer(layer_case *c)
{
    char *p[NLBUF];
    for (int i = 0; i < NLBUF; i++)
        p[i] = c->buf[i].data;
    switch (c->alias) {
    case 10: p[L_KEY] = p[L_VALUE] = p[L_QUERY]; break; /* self-attention */
    case 11: p[L_OUT] = p[L_QUERY]; break;
    case 12: p[L_OUT] = p[L_VALUE]; break;
    case 13: p[L_W] = p[L_OUT]; break;
    case 14: p[L_W] = p[L_KEY]; break;
    default: break;
    }
    for (int i = 0; i < 4; i++)
        if (c->null_in[i])
            p[i] = NULL;
    link_mask(&c->mb, &c->mask);
    alias_mask_into(c->alias, &c->mb, &c->mask, c->buf[L_OUT].data);
    layer_pointers lp = {(const float *)p[L_QUERY], (const float *)p[L_KEY],
                         (const float *)p[L_VALUE], (float *)p[L_OUT],
                         c->want_weights ? (float *)p[L_W] : NULL};
    return lp;
}

void free_layer_case(layer_case *c)
{
    for (int i = 0; i < NLBUF; i++)
        buffer_free(&c->buf[i]);
    for (int i = 0; i < NDBUF; i++)
        buffer_free(&c->dbuf[i]);
    for (int i = 0; i < 3; i++)
        buffer_free(&c->mb.buf[i]);
}

/* Bytes after the engine's: H, head dim, kdim, vdim, form, bias flags,
 * B, Lq, Lk, weights flag, misalign, alias, mask (11), seed (4),
 * specials (33), corruptions. */
void fuzz_layer(byte_reader *in, mha_engine *engine,
                       const char *engine_desc)
{
    layer_case c;
    memset(&c, 0, sizeof c);
    mha_layer_desc *d = &c.desc;
    d->num_heads = 1 + take8(in) % 6;
    d->embed_dim = d->num_heads * (1 + take8(in) % 12);
    unsigned kcode = take8(in), vcode = take8(in);
    d->kdim = kcode < 160 ? 0 : 1 + kcode % 48;
    d->vdim = vcode < 160 ? 0 : 1 + vcode % 48;
    unsigned form = take8(in) % 8;
    c.form = form < 3 ? 0 : form < 6 ? 1 : (int)form - 4;
    unsigned bflags = take8(in);
    d->in_proj_bias = (bflags & 1) ? (const float *)&c : NULL; /* marks */
    d->out_proj_bias = (bflags & 2) ? (const float *)&c : NULL;
    c.null_out_w = (bflags & 12) == 12;
    c.B = 1 + take8(in) % 3;
    c.Lq = seq_of(take8(in));
    c.Lk = seq_of(take8(in));
    c.want_weights = take8(in) & 1;
    c.misalign = take8(in);
    c.alias = (int)(take8(in) % 16);
    fit_layer(&c);
    parse_mask(in, &c.mreq);
    mask_presence(&c.mreq, &c.mb);
    build_mask(&c.mreq, d->num_heads, c.Lq, c.Lk, &c.mask);
    c.seed = take32(in);
    special_request sp;
    parse_specials(in, &sp);
    corrupt_layer(in, &c);

    /* mha_layer_create */
    fault_list f = {0};
    int huge = 0;
    describe_layer(&c, engine_desc, "create", &f, huge);
    layer_create_model(&c, engine, &f, &huge);
    describe_layer(&c, engine_desc, "create", &f, huge);
    announce();
    if (f.n == 0 && huge) {
        stats[S_LAYER_SKIP]++;
        free_layer_case(&c);
        return;
    }
    for (int i = 0; i < NDBUF; i++)
        buffer_snapshot(&c.dbuf[i]);
    mha_layer *const untouched = (mha_layer *)(uintptr_t)0x5a5a5a60u;
    mha_layer *layer = untouched;
    mha_status st = mha_layer_create(c.null_engine ? NULL : engine, d,
                                     &layer);
    check_status_known(st);
    for (int i = 0; i < NDBUF; i++)
        REQUIRE_AT(buffer_unchanged(&c.dbuf[i]), "desc buffer %d written",
                   i);
    if (f.n > 0) {
        stats[S_CREATE_FAULT]++;
        check_failure(st, &f, huge);
        REQUIRE(layer == untouched);
        free_layer_case(&c);
        return;
    }
    REQUIRE_AT(st == MHA_OK, "valid create failed: %s",
               mha_status_string(st));
    REQUIRE(layer != NULL && layer != untouched);
    /* The layer copies what it needs: the caller's arrays may go now. */
    for (int i = 0; i < NDBUF; i++) {
        free(c.dbuf[i].base);
        c.dbuf[i].base = c.dbuf[i].data = NULL;
    }

    /* mha_layer_forward */
    fault_list g = {0};
    huge = 0;
    layer_forward_model(&c, &g, &huge);
    describe_layer(&c, engine_desc, "forward", &g, huge);
    if ((g.n == 0 && huge) || c.mb.lengths_unreadable) {
        stats[S_LAYER_SKIP]++;
        goto done;
    }
    alloc_layer(&c);
    buffer_fill_sentinel(&c.buf[L_OUT]);
    buffer_fill_sentinel(&c.buf[L_W]);
    for (int i = L_QUERY; i <= L_VALUE; i++)
        fill_values(&c.buf[i], MHA_F32, c.seed * 5ull + (uint64_t)i);
    if (c.mb.use)
        fill_mask(&c.mreq, &c.mb, c.Lk, c.seed);
    int shared = c.alias == 10;
    buffer *targets[4] = {&c.buf[L_QUERY], &c.buf[shared ? L_QUERY : L_KEY],
                          &c.buf[shared ? L_QUERY : L_VALUE],
                          c.mb.bias ? &c.mb.buf[1] : NULL};
    const mha_dtype f32[4] = {MHA_F32, MHA_F32, MHA_F32, MHA_F32};
    inject_specials(&sp, targets, f32);
    layer_pointers lp = link_layer(&c);
    length_faults(&c.mb, &c.mask, c.B, c.Lk, &g);
    describe_layer(&c, engine_desc, "forward", &g, huge);
    announce();
    snapshot_all(c.buf, NLBUF, &c.mb);
    st = mha_layer_forward(c.null_layer ? NULL : layer, lp.query, lp.key,
                           lp.value, c.B, c.Lq, c.Lk,
                           c.mb.use ? &c.mask : NULL, lp.out, lp.weights);
    stats[g.n ? S_LAYER_FAULT : S_LAYER_OK]++;
    if (check_call(st, &g, huge, c.buf, NLBUF, &c.mb))
        check_layer_outputs(&c, &lp);
done:
    mha_layer_destroy(layer);
    free_layer_case(&c);
}

/* Byte 0 picks the case (bit 0 the layer, bit 1 a continuous batch, bit 2
 * quantisation, else attention); then the engine's 2 bytes. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (verbose < 0) {
        verbose = getenv("FUZZ_VERBOSE") != NULL;
        if (getenv("FUZZ_STATS"))
            atexit(print_stats);
    }
    byte_reader in = {data, size};
    unsigned op = take8(&in);
    char engine_desc[96];
    detail[0] = '\0';
    snprintf(context, sizeof context, "engine creation");
    mha_engine *engine = make_engine(&in, engine_desc, sizeof engine_desc);
    /* op 0: attention, odd: the layer, 2 (mod 4): a continuous batch,
     * 4 (mod 8): mha_quantize or mha_quantize_paged (no engine). */
    if (op & 1)
        fuzz_layer(&in, engine, engine_desc);
    else if (op & 2)
        fuzz_varlen(&in, engine, engine_desc);
    else if (op & 4)
        fuzz_quantize(&in, engine_desc);
    else
        fuzz_attention(&in, engine, engine_desc);
    mha_engine_destroy(engine);
    return 0;
}
