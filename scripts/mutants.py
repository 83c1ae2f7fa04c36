#!/usr/bin/env python3
"""Mutation check of the tests: plants one realistic bug at a time into a copy of the tree, builds
the copy, and runs `make test`'s driver on it (scripts/run_tests.sh, stopping at the first failing
part, on the references already in ref/). Every mutant must fail. Prints a table: the bug, the
first check that failed, its error against its tolerance.

    python3 scripts/mutants.py [--jobs 16] [--only NAME ...] [--gpu_only] [--out TABLE.md] [--keep DIR]
    python3 scripts/mutants.py --host_only [--only NAME ...]    # HOST_MUTANTS, on any machine
    python3 scripts/mutants.py --dev [--only NAME ...]          # DEV_MUTANTS, on a GPU machine

MUTANTS run on a GPU machine after `make test` has written the small references (ref/small_*). The
copies are built for sm_90a (and compute_80 PTX, which make test looks for), in parallel, and
each copy's tests run (one copy at a time) as soon as it is built; the dev/
kernel checks are left out (they are not rebuilt per mutant), so every bug here must be caught by
test_llama3 or the trainer's own runs. --gpu_only leaves the host unit tests and bad-input checks
out, to show what the GPU tests alone catch of a bug that the host tests see first. HOST_MUTANTS
are bugs of the host-side code (llama3.h, the trainer's main) that the host tests must catch
without a GPU: --host_only runs them with the GPU parts left out. DP_MUTANTS are bugs of the
data-parallel step: --data_parallel builds only the trainer (DATA_PARALLEL=1, with the NCCL that
NCCL_HOME names) and runs only scripts/test_ranks.sh, on the small model of ref/small_t64. Each mutant
replaces a piece of code that must occur exactly once: when the code moves, the script stops and
says which to update.
"""
import concurrent.futures as cf
import os
import re
import shutil
import subprocess
import sys
import tempfile

from cli import ArgumentParser

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
GENCODE = "-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=compute_80"  # (make test checks the PTX)

# name, kind, file, what the bug does, code, its replacement
MUTANTS = [
    ("ffn_norm_weight", "wiring", "train_llama3.cu", "the FFN RMSNorm reads the layer's attention-norm weight",
     "norm_forward(m, B, P_FFN_NORM, l, h, normed_ffn,", "norm_forward(m, B, P_ATTN_NORM, l, h, normed_ffn,"),
    ("norm_backward_weight", "wiring", "train_llama3.cu", "every RMSNorm backward reads layer 0's weight",
     "*weight = param_f32(m, param_offset(m, tensor, layer));", "*weight = param_f32(m, param_offset(m, tensor, 0));"),
    ("softmax_no_rescale", "kernel", "kernels.cuh", "flash forward: the running sum and output not rescaled "
     "when the row max moves to a later key tile",
     "        correction[r] = exp2f(row_max[r] - base[r]);", "        correction[r] = 1.0f;"),
    ("hd128_half_rescaled", "kernel", "kernels.cuh", "flash forward at head_dim 128: only the first half of the "
     "head's output rescaled when the row max moves to a later key tile",
     "    for (int d = 0; d < HD / 8; d++)\n#pragma unroll\n        for (int e = 0; e < 4; e++) o[d][e] *= correction",
     "    for (int d = 0; d < (HD == 128 ? HD / 16 : HD / 8); d++)\n#pragma unroll\n        for (int e = 0; e < 4; e++) "
     "o[d][e] *= correction"),
    ("wrong_tile_prefetched", "kernel", "kernels.cuh", "flash forward: the current key tile prefetched again "
     "instead of the next",
     "kt + 1, T);\n        const KeyTile<HD>& tile = kv[buf];\n        float s[",
     "kt, T);\n        const KeyTile<HD>& tile = kv[buf];\n        float s["),
    ("fp8_weight_scale_is_inputs", "fp8", "train_llama3.cu", "--fp8 1 forward: the input's inverse scale applied "
     "twice, the weight's not at all",
     "&fp8_weight_scale(m, tensor, layer)->scale_inv,\n               B * m->T, out, in, false);",
     "&fp8_act_scale(m, tensor, layer, false)->scale_inv,\n               B * m->T, out, in, false);"),
    ("fp8_stale_amax", "fp8", "train_llama3.cu", "--fp8 1: one amax slot per linear for every layer, so an "
     "operand's scale comes from the largest of the earlier layers' too",
     "(size_t)slice_of(&m->tab, tensor, layer)->fp8_slot * 2 + grad", "(size_t)slice_of(&m->tab, tensor, 0)->fp8_slot * 2 + grad"),
    ("fp8_amax_not_reset", "fp8", "train_llama3.cu", "--fp8 1: the activation amaxes not reset as the forward "
     "starts, so each is the largest of every step's so far", "    fp8_reset_scales(m);\n", ""),
    ("fp8_amax_of_first_micro_step", "fp8", "train_llama3.cu", "--fp8 1 with micro-steps: the amaxes reset in a "
     "step's first forward only, so micro-step 2 quantises with the larger of micro-step 1's and its own",
     "    fp8_reset_scales(m);\n", "    if (inputs == m->tokens) fp8_reset_scales(m);\n"),
    ("fp8_recompute_down_input_stale", "fp8", "train_llama3.cu", "--fp8 1 --recompute 2: the block's forward again "
     "skips down's input quantisation with its GEMM, so down's weight gradient reads the last layer's input",
     "    else if (fp8_linear(m, P_DOWN, l)) fp8_quantize_input(m, B, P_DOWN, l, act, F); // [fp8] its transpose, for dW\n", ""),
    ("fp8_accumulated_grad_overwritten", "fp8", "train_llama3.cu", "--fp8 1 with micro-steps: the FP8 weight-"
     "gradient GEMM writes (beta 0) over the earlier micro-steps' sum instead of adding",
     "N, false, !bf16_out, accumulate ? 1.0f : 0.0f);", "N, false, !bf16_out, 0.0f);"),
    ("fp8_weight_copy_stale", "fp8", "train_llama3.cu", "--fp8 1: a block linear's FP8 copy not remade after its "
     "AdamW, so the next step's GEMMs read the weights from before the update",
     "    if (fp8_linear(m, tensor, layer)) fp8_quantize_weight(m, tensor, layer, s); // [fp8] from the new shadow\n", ""),
    ("fp8_grads_e4m3", "fp8", "train_llama3.cu", "--fp8 1: the output gradients quantised to e4m3 where the GEMMs "
     "read e5m2", "else fp8_quantize_operand(m, B, (e5m2*)f->dy, (e5m2*)f->dy_t,",
     "else fp8_quantize_operand(m, B, (e4m3*)f->dy, (e4m3*)f->dy_t,"),
    ("fp8_e4m3_grads_as_e5m2", "fp8", "train_llama3.cu", "--fp8_grads e4m3: the output gradients quantised to e5m2 "
     "where the GEMMs read e4m3", "CUDA_R_8F_E4M3)\n        fp8_quantize_operand(m, B, (e4m3*)f->dy, (e4m3*)f->dy_t,",
     "CUDA_R_8F_E4M3)\n        fp8_quantize_operand(m, B, (e5m2*)f->dy, (e5m2*)f->dy_t,"),
    ("fp8_grads_flag_ignored", "fp8", "train_llama3.cu", "--fp8_grads e4m3 ignored: the gradients stay e5m2",
     "m->fp8->grad_type = grads == FP8_GRADS_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;",
     "m->fp8->grad_type = CUDA_R_8F_E5M2;"),
    ("dq_10pct", "kernel", "kernels.cuh", "flash backward (mma.sync): dQ 10 % too large",
     "dS K\n    }\n    store_head_rows<HD>(dq + (size_t)bh * T * HD, dq_acc, row, T, scale);",
     "dS K\n    }\n    store_head_rows<HD>(dq + (size_t)bh * T * HD, dq_acc, row, T, 1.1f * scale);"),
    ("dk_10pct", "kernel", "kernels.cuh", "flash backward: dK 10 % too large",
     "store_head_rows<HD>(dk + kv_head, dk_acc, key, T, scale);",
     "store_head_rows<HD>(dk + kv_head, dk_acc, key, T, 1.1f * scale);"),
    ("doc_mask_dkv_leaks", "document mask", "kernels.cuh", "--doc_mask 1, flash dK/dV: each key's document end "
     "ignored, so a key takes gradient from the queries of the documents after it",
     "    return DOC_MASK && t < T ? docs.end[(size_t)b * T + t] - 1 : T - 1;", "    return T - 1;"),
    ("doc_end_inclusive", "document mask", "kernels.cuh", "--doc_mask 1: a document's end found at t or after "
     "instead of after t, so a BOS key's document ends at itself and no query's gradient reaches it",
     "        if (to_end) Scan(scratch).ExclusiveScan(seen, scanned, MaxOf(), before);\n"
     "        else Scan(scratch).InclusiveScan(seen, scanned, MaxOf(), before);",
     "        Scan(scratch).InclusiveScan(seen, scanned, MaxOf(), before);"),
    ("doc_mask_unfused_ignored", "document mask", "kernels.cuh", "--doc_mask 1 --flash_attention 0: the unfused "
     "softmax ignores the documents (every query sees all keys before it)",
     "    return doc_start ? doc_start[row / ((size_t)NH * T) * T + row % T] : 0;", "    return 0;"),
    ("rms_dw_slice_dropped", "kernel", "kernels.cuh", "RMSNorm weight gradient: the column sum drops its "
     "last row slice",
     "for (int y = 0; y < 32; y++) total += s[y * 32 + t];", "for (int y = 0; y < 31; y++) total += s[y * 32 + t];"),
    ("swiglu_backward", "kernel", "kernels.cuh", "SwiGLU backward: d gate = d silu * sigmoid (the silu "
     "derivative's second term lost)",
     "dsilu * (sig * (1.0f + gv * (1.0f - sig)))", "dsilu * sig"),
    ("sparse_grad_not_zeroed", "kernel", "kernels.cuh", "sparse AdamW leaves the used wte gradient rows "
     "(the next step adds onto them)",
     "            store16(grads + row + c, Vec16<float>{});\n", ""),
    ("deferred_wrong_step", "optimizer path", "train_llama3.cu", "deferred AdamW with the current step's "
     "bias corrections instead of its own step's",
     "adamw_deferred(m, optimizer_hyper_previous(&m->optim), m->step.opt_stream)",
     "adamw_deferred(m, optimizer_hyper(&m->optim), m->step.opt_stream)"),
    ("overlapped_wrong_step", "optimizer path", "train_llama3.cu", "overlapped per-layer AdamW with the "
     "previous step's hyperparameters",
     "else adamw_tensor(m, g->tensor, g->layer, optimizer_hyper(&m->optim), m->step.opt_stream);",
     "else adamw_tensor(m, g->tensor, g->layer, optimizer_hyper_previous(&m->optim), m->step.opt_stream);"),
    ("previous_step_not_kept", "optimizer path", "kernels.cuh", "the step counter kernel does not keep the "
     "previous step's hyperparameters for the deferred layers",
     "    h->previous = h->latest;\n", ""),
    ("flush_skipped", "optimizer path", "train_llama3.cu", "the final flush applies nothing: the last "
     "step's deferred layers are never updated",
     "    adamw_deferred(m, optimizer_hyper(&m->optim), m->stream);\n    m->step.pending.updates = false;",
     "    m->step.pending.updates = false;"),
    ("micro_steps_overwrite", "accumulation", "train_llama3.cu", "every micro-step's weight-gradient GEMM "
     "overwrites (beta 0) instead of adding",
     "true, false, !bf16_out, 1.0f, accumulate ? 1.0f : 0.0f);", "true, false, !bf16_out, 1.0f, 0.0f);"),
    ("step_work_overwrite", "accumulation", "train_llama3.cu", "the training step's later micro-steps do not "
     "accumulate (only the last micro-batch's gradient is used)",
     "accumulate = micro > 0 || m->sw.grad_zeroing != GRAD_ZERO_NONE;",
     "accumulate = m->sw.grad_zeroing != GRAD_ZERO_NONE;"),
    ("loss_scale_ignores_accum", "accumulation", "train_llama3.cu", "dlogits scaled by 1/N instead of "
     "1/(N * micro-steps)",
     "1.0f / ((float)N * m->grad_accum), m->stream);", "1.0f / (float)N, m->stream);"),
    ("loader_no_advance", "loader", "llama3.h", "the data loader never moves past the first batch",
     "    if (l->micro == 0 && !l->cfg.overfit_single_batch) l->at.group++;\n", ""),
    ("uint16_offset", "loader", "llama3.h", "uint16 token files read one token late",
     "memcpy(&t16, src + 2 * i, 2);", "memcpy(&t16, src + 2 * i + 2, 2);"),
    ("rope_factor", "rope", "llama3.h", "llama3 RoPE scaling factor 8 whatever the model file says",
     "const double factor = c->rope_factor,", "const double factor = 8.0,"),
    ("rope_factor_fixed_32", "rope", "llama3.h", "llama3 RoPE scaling factor 32 whatever the model file says "
     "(small_hd128's 8 ignored)", "const double factor = c->rope_factor,", "const double factor = 32.0,"),
    ("checkpoint_no_flush", "checkpoints", "train_llama3.cu", "a save does not apply the deferred AdamW updates "
     "first (the saved weights miss them, and the eager step after the save skips them)",
     "    saver_join(s); // the host buffers are free again\n    optimizer_flush(m);\n",
     "    saver_join(s); // the host buffers are free again\n    m->step.pending.updates = false;\n"),
    ("resume_step_not_restored", "checkpoints", "train_llama3.cu", "a resume restores m and v but not AdamW's step "
     "counter (bias corrections start again at step 1)",
     "    CUDA_CHECK(cudaMemcpy(o->steps, &step, sizeof(int), cudaMemcpyHostToDevice));\n", ""),
    ("lr_schedule_step", "training loop", "kernels.cuh", "the schedule's lr of the next step (off by one)",
     "p.lr = lr_at(o.sched, t);", "p.lr = lr_at(o.sched, t + 1);"),
    ("clip_scale_ignored", "training loop", "kernels.cuh", "AdamW ignores the clipping scale (the norm is "
     "measured, the gradients not clipped)", "    g *= h.grad_scale;\n", ""),
    ("norm_rows_repeated", "training loop", "kernels.cuh", "the gradient norm counts a wte row once per "
     "occurrence of its token", "        if (!owns_row(sorted_tokens, j)) continue;\n", ""),
    ("norm_weights_decayed", "training loop", "train_llama3.cu", "weight decay on the norm weights too",
     "bool decay = begin < m->layout.norm_begin;", "bool decay = true;"),
    ("nan_guard_ignored", "training loop", "kernels.cuh", "the dense AdamW updates on a step the NaN guard skips",
     "    if (h.skip) return;\n", ""),
    ("val_no_flush", "training loop", "train_llama3.cu", "the val loss reads the weights without the step's "
     "deferred updates", "    optimizer_flush(m);\n    for (int i = 0; i < v->n_batches; i++) {",
     "    for (int i = 0; i < v->n_batches; i++) {"),
    ("flush_keeps_pending", "training loop", "train_llama3.cu", "a flush (val loss, sample, save) leaves the "
     "updates it applied pending: the next step (from the graph) applies them a second time",
     "    adamw_deferred(m, optimizer_hyper(&m->optim), m->stream);\n    m->step.pending.updates = false;\n",
     "    adamw_deferred(m, optimizer_hyper(&m->optim), m->stream);\n"),
    ("sample_temperature_ignored", "sampling", "kernels.cuh", "sampling weighs exp(logit - max) whatever the "
     "temperature", "expf((logit_value(x) - max_logit) / temperature)", "expf(logit_value(x) - max_logit)"),
    ("top_k_one_more", "sampling", "kernels.cuh", "top-k keeps the k + 1 largest logits",
     "if (block_sum(n) >= top_k) threshold = t;", "if (block_sum(n) > top_k) threshold = t;"),
    ("uniform_biased", "sampling", "train_llama3.cu", "next_uniform divides its 24 bits by 2^23: draws over "
     "[0, 2), half of them clamped to the last kept token",
     "return (float)((z ^ (z >> 31)) >> 40) / 16777216.0f;", "return (float)((z ^ (z >> 31)) >> 40) / 8388608.0f;"),
    ("ce_sum_not_rescaled", "kernel", "kernels.cuh", "cross-entropy: a thread's running sum is not rescaled when a "
     "later load of its row raises the max (vocabularies above 4096 only)",
     "float sum = st.sum * expf(st.max - m);", "float sum = st.sum;"),
    ("ce_backward_one_pass", "kernel", "kernels.cuh", "cross-entropy: dlogits written over a row's first 4096 "
     "logits only (the rest keep the logits)",
     "    __syncthreads();\n    for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {\n        Vec16<bf16> x = load16(row + i);\n        for (int e = 0; e < 8; e++) {\n            float p = expf(",
     "    __syncthreads();\n    for (int i = threadIdx.x * 8; i < V && i < 4096; i += blockDim.x * 8) {\n        Vec16<bf16> x = load16(row + i);\n        for (int e = 0; e < 8; e++) {\n            float p = expf("),
    ("resume_log_truncated", "checkpoints", "llama3.h", "a resumed run starts its --log_file anew (the first "
     "part's lines lost)", 'FILE* f = fopen(path, resumed ? "a+" : "w");', 'FILE* f = fopen(path, "w");'),
    ("resume_schedule_of_invocation", "checkpoints", "llama3.h", "the lr schedule spans this invocation "
     "(--stop_after), not --num_iteration: a run in parts decays differently",
     "    if (l->total_batch_size == 0 && total <= INT_MAX) l->total_batch_size = (int)total;\n",
     "    if (l->total_batch_size == 0 && total <= INT_MAX) l->total_batch_size = (int)total;\n"
     "    a->optim.sched.total = last_step(a);\n"),
    ("init_seed_from_clock", "determinism", "train_llama3.cu", "the random init seeded from the clock as "
     "well as --seed", "model_init_random(m, a->loop.seed);", "model_init_random(m, a->loop.seed ^ (uint64_t)time(NULL));"),
    ("embedding_grad_atomic", "determinism", "kernels.cuh", "the embedding gradient added row by row with "
     "atomicAdd in arrival order (right values, order-dependent rounding)",
     """    if (!owns_row(sorted_tokens, j)) return;
    int tok = sorted_tokens[j], end = j + 1;""",
     """    int tok = sorted_tokens[j], end = j + 1;
    for (int c = threadIdx.x * 4; c < C; c += blockDim.x * 4)
        for (int e = 0; e < 4; e++) atomicAdd(dwte + (size_t)tok * C + c + e, dresid[(size_t)sorted_positions[j] * C + c + e]);
    return;"""),
    ("tied_head_grad_dropped", "tied embeddings", "train_llama3.cu", "the head's weight gradient written to "
     "lm_head's slot as when untied: a tied wte's gradient lacks it (only the embedding's rows)",
     "weight_grad(m, n, head, 0, m->acts.logits, x, V, C, accumulate || first > 0);",
     "weight_grad(m, n, P_LM_HEAD, 0, m->acts.logits, x, V, C, accumulate || first > 0);"),
    ("classifier_last_chunk_dropped", "chunked classifier", "train_llama3.cu", "the classifier's last chunk dropped "
     "when it is shorter than the others: its rows get no loss, dlogits or head gradient",
     "for (int first = 0; first < N; first += rows) {", "for (int first = 0; first + rows <= N; first += rows) {"),
    ("classifier_chunks_overwrite", "chunked classifier", "train_llama3.cu", "each classifier chunk's head GEMM "
     "writes the head's gradient (beta 0) instead of adding to the chunks before it: only the last chunk's rows count",
     "weight_grad(m, n, head, 0, m->acts.logits, x, V, C, accumulate || first > 0);",
     "weight_grad(m, n, head, 0, m->acts.logits, x, V, C, accumulate);"),
    ("recompute_previous_input", "recompute", "train_llama3.cu", "--recompute 2 runs each block's forward again "
     "from the previous layer's saved input",
     "if (again || l == 0) norm_forward(m, B, P_ATTN_NORM, l, NULL, normed_attn, rstd_attn, resid, NULL);",
     "if (again || l == 0)\n        norm_forward(m, B, P_ATTN_NORM, l, NULL, normed_attn, rstd_attn, again && l > 0 ? resid - NC : resid, NULL);"),
    ("recompute_ffn_norm_of_resid", "recompute", "train_llama3.cu", "--recompute 1 recomputes the FFN norm's "
     "output from the block's input instead of the residual after attention",
     "m->acts.rstd_ffn + l * N, m->acts.h + l * NC, NULL);", "m->acts.rstd_ffn + l * N, m->acts.resid + l * NC, NULL);"),
    # (test_hf_convert.py's tied round trip, a host part, sees it first; with --gpu_only only test_hf_trainer.py's
    # tied case: the untied exports are not touched)
    ("export_tie_dropped", "tied embeddings", "scripts/export_hf.py", "export_hf.py writes tie_word_embeddings false "
     "for a tied model file: the export has no lm_head.weight, and from_pretrained leaves lm_head random and untied",
     '"tie_word_embeddings": bool(c.tied_embeddings),', '"tie_word_embeddings": False,'),
    ("own_flags_incomplete", "scripts", "scripts/test_hf_trainer.py", "test_hf_trainer.py's OWN_FLAGS forgets "
     "--eval_every, a flag its runs set: --trainer_flags could give it again and the trainer would take that one",
     '"--eval_file", "--eval_every",', '"--eval_file",'),
    ("moments_stream_repeats", "bf16 moments", "kernels.cuh", "the stochastic rounding of bf16 m and v draws the "
     "same bits every step (the stream keyed by the element only)",
     "std::is_same<P, bf16>::value) return rounding_bits(element, t);",
     "std::is_same<P, bf16>::value) return rounding_bits(element, 0);"),
    ("moments_round_nearest", "bf16 moments", "kernels.cuh", "bf16 m and v rounded to nearest (v's small steps "
     "rounded away)", "return __ushort_as_bfloat16((unsigned short)((b + (r16 & 0xFFFFu)) >> 16));",
     "return __float2bfloat16_rn(x);"),
    ("fp8_unfused_norm_amax_assumed", "fp8", "train_llama3.cu", "--fp8 1 --fused_rmsnorm 0: the norms' outputs "
     "and gradients are taken to carry an amax from their kernel, which the separate ops never write",
     "    return from_norm && m->sw.fused_rmsnorm;", "    return from_norm;"),
    ("bf16_weights_saved_unwidened", "bf16 weights", "train_llama3.cu", "--master_weights bf16: a checkpoint's "
     "model.bin holds the matmul weights' bf16 pairs as if they were floats, and a resume reads garbage",
     "    weights_widen(&p, s->bf16_weights, s->params);", "    weights_widen(&p, false, s->params);"),
    ("offload_load_leaves_v", "offload", "train_llama3.cu", "--offload_optimizer 1: a resume copies the checkpoint's "
     "m back into host memory and leaves v as the reset left it (zero)",
     "memcpy(o->moment[0], host_m, bytes), memcpy(o->moment[1], host_v, bytes);",
     "memcpy(o->moment[0], host_m, bytes);"),
]

# Bugs the host tests catch on a machine without a GPU (run with --host_only).
# Bugs of the data-parallel step: built with DATA_PARALLEL=1, caught by the two-rank part
# (scripts/test_ranks.sh, which needs NCCL >= 2.30 on a one-GPU machine). --data_parallel runs them.
# shard_group_update's two halves, which gather_before_adamw swaps: this rank's AdamW (and [fp8] its parts'
# FP8 copies), then the all-gathers.
SHARD_UPDATE = ("    for (int i = 0; i < n; i++) shard_adamw(m, s[slices[i]].tensor, s[slices[i]].layer, h);\n"
                "    if (m->fp8) {\n"
                "        each_fp8(fp8_shard_amax);\n"
                "        comm_group(true);\n"
                "        each_fp8(fp8_shard_scale_reduce);\n"
                "        comm_group(false);\n"
                "        each_fp8(fp8_shard_quantize);\n"
                "    }\n")
SHARD_GATHER = ("    comm_group(true);\n"
                "    for (int i = 0; i < n; i++) shard_gather(m, s[slices[i]].tensor, s[slices[i]].layer);\n"
                "    comm_group(false);\n")
DP_MUTANTS = [
    ("grads_summed", "data parallel", "train_llama3.cu", "the reduce-scatter sums the ranks' gradients instead of "
     "averaging them (N times the gradient)",
     "NCCL_CHECK(ncclReduceScatter(x, x + (size_t)rank * part, part, nccl_type<T>(), ncclAvg, c, s));",
     "NCCL_CHECK(ncclReduceScatter(x, x + (size_t)rank * part, part, nccl_type<T>(), ncclSum, c, s));"),
    ("grads_not_reduced", "data parallel", "train_llama3.cu", "each rank updates its part with its own gradient "
     "(the reduce-scatter left out)",
     "        if (sh.part) reduce_scatter(c->nccl, g, sh.part, c->rank, m->step.opt_stream);\n", ""),
    ("fp8_scales_differ_between_ranks", "data parallel", "train_llama3.cu", "--fp8 1: the amaxes of the ranks' "
     "parts not all-reduced, so each rank quantises its part of a weight with a scale of its own: the gathered FP8 "
     "copy mixes scales, and the ranks' weight scales differ",
     "        each_fp8(fp8_shard_scale_reduce);\n", ""),
    ("fp8_gathered_weight_not_transposed", "data parallel", "train_llama3.cu", "--fp8 1: the all-gathered FP8 weight "
     "not transposed, so the backward's dX GEMMs read W^T from before the update",
     "    each_fp8(fp8_shard_transpose);\n", ""),
    ("gather_before_adamw", "data parallel", "train_llama3.cu", "a group's all-gather issued before its AdamW: the "
     "ranks read each other's parts as they were before the step",
     SHARD_UPDATE + SHARD_GATHER, SHARD_GATHER + SHARD_UPDATE),
    ("model_file_not_gathered", "data parallel", "train_llama3.cu", "a save of two ranks writes model.bin without "
     "the all-gather of the fp32 weights: the parts rank 1 updates are stale in rank 0's copy",
     "    if (m->comm) gather_masters(m);\n    CUDA_CHECK(cudaEventRecord(s->flushed, m->stream));\n",
     "    CUDA_CHECK(cudaEventRecord(s->flushed, m->stream));\n"),
    ("union_rows_one_rank", "data parallel", "train_llama3.cu", "the embedding's rows are each rank's own (the "
     "union's all-reduce left out): the ranks' embeddings drift apart",
     "    all_reduce(c->nccl, c->union_grads, c->union_grads, (size_t)n_union(m) * C, COMM_AVG, m->step.opt_stream);\n", ""),
]

HOST_MUTANTS = [
    ("classifier_chunk_ignored", "chunked classifier", "llama3.h", "--classifier_chunk ignored: the automatic rows "
     "always", "    if (chunk > 0) return chunk < N ? chunk : (int)N;\n", ""),
    ("logits_sized_for_all_rows", "chunked classifier", "train_llama3.cu", "the memory check counts the logits of all "
     "B*T rows, not one chunk's: T = 131072 seems to need 27 GiB more",
     "ACT_ROW(logits, (size_t)head_rows * V)", "ACT_ROW(logits, N * V)"),
    # (caught by scripts/test_rope.py, which needs torch and transformers: on a machine without them it is skipped)
    ("rope_angle_in_double", "rope", "llama3.h", "the RoPE table's angle position * inv_freq taken in double, not "
     "fp32 as HF's and Meta's (up to 4e-3 off theirs at position 131071)",
     "            float angle = (float)t * inv_freq[i];", "            double angle = (double)t * inv_freq[i];"),
    ("offload_moments_counted_on_gpu", "offload", "train_llama3.cu", "--offload_optimizer 1: the memory check still "
     "counts m and v on the GPU, so a model that fits with them on the host is refused",
     "bf16_weight_bytes(m), host ? 0 : moments,", "bf16_weight_bytes(m), moments,"),
    ("recipe_check_reads_last_line", "scripts", "scripts/test_recipes.sh", "make test-recipes looks for the first "
     "recipe's val loss in the log's last line, which is the last step's sample, and fails a whole run",
     """grep '"loss"' "$work/run.jsonl" | tail -n 1 | grep -q '"val_loss"'""",
     """tail -n 1 "$work/run.jsonl" | grep -q '"val_loss"'"""),
    ("bf16_weights_memory_counts_masters", "bf16 weights", "train_llama3.cu", "--master_weights bf16: the memory "
     "check counts the fp32 masters it no longer has, so the 8B recipe seems not to fit 80 GB",
     "    MemoryParts parts = {f32_block_count(p, bf16_weight_range(m)) * 4 + bf16_weight_bytes(m),",
     "    MemoryParts parts = {p->total * 4 + bf16_weight_bytes(m),"),
    ("widen_reads_lower_half", "bf16 weights", "llama3.h", "a save of bf16 weights widens bf16 values read from the "
     "lower half of the range's bytes, where the stale floats are",
     "    const unsigned char* half = (const unsigned char*)x + 2 * n;", "    const unsigned char* half = (const unsigned char*)x;"),
    ("fp8_gathers_bf16_copy_too", "data parallel", "train_llama3.cu", "--fp8 1 under ranks: the block linears' bf16 "
     "shadows all-gathered beside their e4m3 copies, 3 bytes a weight where 1 does",
     "    g.shadow = !g.fp8 && has_shadow(m, offset);\n", "    g.shadow = has_shadow(m, offset);\n"),
    ("parquet_first_row_group_only", "scripts", "scripts/prepare_data.py", "--input PARQUET reads its first "
     "row group only (FineWeb's files hold many)", "        for group in range(table.num_row_groups):",
     "        for group in range(min(table.num_row_groups, 1)):"),
    ("prefetch_next_epoch_order_wrong", "data", "llama3.h", "at an epoch's end the loader reads ahead the shard "
     "first in this epoch's order, not the next's (the next epoch's first shard is read when due: a stall)",
     "permutation(order, n, l->cfg.shuffle, order_key(l->cfg.seed, l->at.epoch + 1, UINT64_MAX));",
     "permutation(order, n, l->cfg.shuffle, order_key(l->cfg.seed, l->at.epoch, UINT64_MAX));"),
    ("hf_qk_rows_kept", "hf_dir", "llama3.h", "--hf_dir keeps q and k rows in HF's half-rotation order (not "
     "reordered to the pairs the trainer rotates)",
     "memcpy(pairs + (2 * i + k) * c->n_embd, buf + (k * D / 2 + i) * c->n_embd,",
     "memcpy(pairs + (2 * i + k) * c->n_embd, buf + (2 * i + k) * c->n_embd,"),
    ("hf_f16_subnormal_doubled", "hf_dir", "llama3.h", "--hf_dir widens an F16 subnormal to twice its value",
     "bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);",
     "bits = sign | ((uint32_t)(113 - e) << 23) | ((man & 0x3ff) << 13);"),
    ("hf_ffn_search_two_decimals", "hf_dir", "llama3.h", "--hf_dir's search for an ffn_dim_multiplier starts at "
     "two decimals (0.94 where convert_hf.py finds 1.0: another header)",
     "for (int decimals = 1; decimals < 8; decimals++) {", "for (int decimals = 2; decimals < 8; decimals++) {"),
    ("hf_save_qk_rows_kept", "hf_dir", "llama3.h", "--save_hf writes q and k rows in the trainer's pair order "
     "(not back in HF's half rotation)", "memcpy(w->rows + (k * D / 2 + i) * C, src + (2 * i + k) * C,",
     "memcpy(w->rows + (2 * i + k) * C, src + (2 * i + k) * C,"),
    ("hf_save_bf16_truncated", "hf_dir", "llama3.h", "--save_hf's bf16 truncates instead of rounding to nearest "
     "even", "return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);", "return (uint16_t)(u >> 16);"),
    ("hf_config_eps_fixed", "hf_dir", "llama3.h", "--save_hf's config.json writes 1e-05 as 0.00001 (Python's "
     "repr switches to an exponent below 1e-4)", "    if (exp < -4 || exp >= 16) {", "    if (exp < -5 || exp >= 16) {"),
    ("checkpoint_hf_not_deleted", "hf_dir", "llama3.h", "a pruned checkpoint's hf/ folder is not deleted (the "
     "prune fails on it)", "return path_fmt(folder, err, \"%s/step_%08d\", dir, step) || delete_folder(folder, 1, err) ? -1 : 0;",
     "return path_fmt(folder, err, \"%s/step_%08d\", dir, step) || delete_folder(folder, 0, err) ? -1 : 0;"),
    ("hf_index_places_unchecked", "hf_dir", "llama3.h", "--hf_dir reads a tensor from a shard the index does "
     "not place it in", "        if (!json_is_string(&d, where, base))\n", "        if (false)\n"),
    ("hf_tied_by_config_only", "hf_dir", "llama3.h", "--hf_dir ties the embeddings only where config.json says "
     "tie_word_embeddings: a tied folder of an older export (no lm_head.weight, no key) is refused as missing "
     "lm_head.weight",
     ")))\n                || hf_find(h, \"lm_head.weight\") < 0;", ")));"),
    ("hellaswag_no_space", "scripts", "scripts/prepare_data.py", "--hellaswag encodes each ending without the "
     "space before it (a different first token than the text has)",
     'ends = [enc.encode_ordinary(" " + e) for e in endings]', 'ends = [enc.encode_ordinary(e) for e in endings]'),
    ("shards_short_last_kept", "scripts", "scripts/prepare_data.py", "--shard_tokens leaves a last shard shorter "
     "than one batch on its own (the trainer skips it: its tokens are never read)",
     "    if len(starts) > 1 and len(tokens) - starts[-1] < MIN_SPLIT_TOKENS:\n        starts.pop()\n", ""),
    ("eval_pick_highest", "eval", "llama3.h", "the eval picks the ending of the highest mean loss",
     "if (mean_loss[k] < mean_loss[best]) best = k;", "if (mean_loss[k] > mean_loss[best]) best = k;"),
    ("eval_targets_unshifted", "eval", "llama3.h", "an eval row's targets are its inputs (not the next tokens): "
     "every ending's loss reads the wrong logits", "int a = t, b = t + 1; // the row's token t and t + 1",
     "int a = t, b = t; // the row's token t and t + 1"),
    ("shuffle_same_every_epoch", "loader", "llama3.h", "--shuffle 1 draws one order of the shards and steps for "
     "the whole run instead of one per epoch",
     "return mix64(seed ^ mix64((epoch + 1) * 0x9E3779B97F4A7C15ull ^", "return mix64(seed ^ mix64((0 + 1) * 0x9E3779B97F4A7C15ull ^"),
    ("shuffle_ignored", "loader", "llama3.h", "--shuffle 1 reads every shard and its steps in order",
     "    if (!shuffle) return;\n    for (size_t i = n; i > 1; i--) {", "    return;\n    for (size_t i = n; i > 1; i--) {"),
    ("val_order_shuffled", "loader", "llama3.h", "the val loader shuffled as the training loader under --shuffle 1: "
     "the val loss reads another set of batches for every --seed",
     "train && a->loop.overfit_single_batch, train && a->loop.shuffle, a->loop.seed};",
     "train && a->loop.overfit_single_batch, a->loop.shuffle, a->loop.seed};"),
    ("resume_grown_data_taken", "checkpoints", "llama3.h", "a resume refuses token data that shrank but takes a shard "
     "rewritten longer (its steps, and the saved position, fall on other tokens)",
     "    if (st->data_tokens != d->total || st->data_hash != d->hash",
     "    if (st->data_tokens > d->total || st->data_hash != d->hash"),
    ("resume_position_lost", "checkpoints", "llama3.h", "a checkpoint keeps the epoch and shard but not the step "
     "within the shard: a resumed run reads the shard from its first step again",
     "st.loader_shard = l->at.shard, st.loader_group = l->at.group;", "st.loader_shard = l->at.shard, st.loader_group = 0;"),
    ("shape_flag_ignored", "flags", "train_llama3.cu", "--shape is parsed but the random init keeps the 1B's shape",
     "Llama3Config cfg = family_config(a.loop.shape);", "Llama3Config cfg = family_config(SHAPE_1B);"),
    ("shape_3b_untied", "flags", "llama3.h", "--shape 3b builds an untied 3B (the released one ties its embedding)",
     "c.ffn_dim_multiplier = 1.0f, c.tied_embeddings = 1;", "c.ffn_dim_multiplier = 1.0f;"),
    ("fp8_advice_without_fp8_0", "flags", "llama3.h", "the out-of-memory advice of an --fp8 1 run leaves out --fp8 0 "
     "and what the FP8 copies take", "    if (f->fp8) ADVISE(", "    if (0) ADVISE("),
    ("ddp_peer_not_wrapped", "benchmark", "scripts/bench_torch.py", "bench_torch.py --ddp trains each rank's model "
     "alone (no DistributedDataParallel): the peer of bench.sh --ranks times no communication",
     "fwd = torch.nn.parallel.DistributedDataParallel(model,", "fwd = model or torch.nn.parallel.DistributedDataParallel(model,"),
    ("llmc_rope_factor_32", "rope", "llama3.h", "llm.c's files read with Llama-3.2's RoPE factor 32, not the 8 "
     "llm.c itself uses", "c.rope_factor = LLMC_ROPE_FACTOR; // its header", "c.rope_factor = LLAMA3_2_ROPE_FACTOR; // its header"),
    ("rope_slot_unread", "rope", "llama3.h", "a seed header's slot 17 not read: every file's RoPE factor 32",
     "c.rope_factor = read_f32(h, 68);", "c.rope_factor = 0.0f;"),
    ("rope_factor_host_32", "rope", "llama3.h", "llama3 RoPE scaling factor 32 whatever the config says",
     "const double factor = c->rope_factor,", "const double factor = 32.0,"),
    ("resume_moments_dtype_unchecked", "checkpoints", "llama3.h", "a resume with the other --optimizer_state is "
     "taken (bf16 moments read as fp32, or the reverse)", "    if (st->moments != a->optim.moments)\n",
     "    if (0)\n"),
    ("json_nan_written", "log", "llama3.h", "a non-finite loss written as printf prints it (nan), not as null",
     "    if (isfinite(v)) snprintf(out, len, fmt, v);", "    if (1) snprintf(out, len, fmt, v);"),
    ("resume_truncates_log", "log", "llama3.h", "a resumed run starts its --log_file anew",
     'FILE* f = fopen(path, resumed ? "a+" : "w");', 'FILE* f = fopen(path, "w");'),
    ("resume_keeps_later_lines", "log", "llama3.h", "a resumed run keeps the log lines after its step",
     "log_line_step(line) <= resumed) keep += n;", "log_line_step(line) >= -1) keep += n;"),
    ("outputs_before_gpu", "log", "train_llama3.cu", "the log and checkpoint folder are opened before the GPU "
     "is looked for", "    gpu_start(&ranks, argv[0]);\n",
     "    open_outputs(&a, &in, argv[0]);\n    gpu_start(&ranks, argv[0]);\n"),
    ("stdout_block_buffered", "log", "train_llama3.cu", "stdout left block-buffered into a file or pipe",
     "    setvbuf(stdout, NULL, _IOLBF, 0);", "   "),
    ("total_batch_fixed", "flags", "llama3.h", "--total_batch_size not given stays 256 instead of B*T",
     "    if (l->total_batch_size == 0 && total <= INT_MAX) l->total_batch_size = (int)total;",
     "    if (l->total_batch_size == 0) l->total_batch_size = 256;"),
    ("no_near_miss", "flags", "llama3.h", "an unknown flag gets no 'did you mean'",
     "const FlagSpec* near = flag_nearest(flag);", "const FlagSpec* near = NULL;"),
    ("outputs_unchecked", "log", "llama3.h", "the --log_file left out of the outputs checked: a log in a folder that "
     "does not exist is found only when it opens, after the GPU",
     '    if (rank0 && a->loop.log_file)\n        out[n++] = output_of("--log_file"',
     '    if (0)\n        out[n++] = output_of("--log_file"'),
    ("parent_check_access", "outputs", "llama3.h", "an output's folder checked with access(W_OK) as before issue 65: a "
     "writable regular file passes, so --save_hf afile/sub fails only at the end of the run",
     "    if (!S_ISDIR(st.st_mode)) return snprintf(why, n, \"%s is %s, not a folder\", folder, file_kind(st.st_mode)), -1;\n"
     "    if (statvfs(folder, &v) != 0) return snprintf(why, n, \"%s: %s\", folder, strerror(errno)), -1;\n"
     "    if (!(v.f_flag & ST_RDONLY) && access(folder, W_OK | X_OK) != 0)",
     "    if (statvfs(folder, &v) != 0) return snprintf(why, n, \"%s: %s\", folder, strerror(errno)), -1;\n"
     "    if (!(v.f_flag & ST_RDONLY) && access(folder, W_OK) != 0)"),
    ("checkpoints_counted_once", "outputs", "llama3.h", "the checkpoint folder's free space checked against one "
     "checkpoint, not the ones kept at once: a run fails at its third save", "OUT_FOLDER, one * k,", "OUT_FOLDER, one,"),
    ("stop_after_ignored", "flags", "llama3.h", "--stop_after does not end the run early",
     "return a->loop.stop_after ? a->loop.stop_after : a->optim.sched.total;", "return a->optim.sched.total;"),
    ("schedule_ends_at_stop", "flags", "llama3.h", "the lr schedule spans the invocation (--stop_after), not "
     "--num_iteration",
     "    if (l->total_batch_size == 0 && total <= INT_MAX) l->total_batch_size = (int)total;\n",
     "    if (l->total_batch_size == 0 && total <= INT_MAX) l->total_batch_size = (int)total;\n"
     "    a->optim.sched.total = last_step(a);\n"),
    ("val_beside_unchecked", "flags", "llama3.h", "--val_every takes a NAME_val.bin beside the token file "
     "that does not exist", "    if (stat(out, &st) != 0 || !S_ISREG(st.st_mode))\n", "    if (0)\n"),
    ("two_ranks_taken", "launch", "llama3.h", "a process launched as one of several ranks (torchrun, mpirun) trains "
     "alone anyway, writing the same outputs as the others", "    if (r->world <= max_world) return 0;\n",
     "    if (r->world <= max_world || 1) return 0;\n"),
    ("launcher_partial_one_rank", "launch", "llama3.h", "a partial set of a launcher's variables (RANK=1 alone, "
     "WORLD_SIZE=2 alone) falls back to one rank: N processes each train alone on the same outputs",
     "    if (!size || !rank)\n        return l3_fail(err, \"%s=%s without %s:",
     "    if (!size || !rank)\n        return 0;\n    if (0)\n        return l3_fail(err, \"%s=%s without %s:"),
    ("shard_boundary_off_by_one", "data parallel", "llama3.h", "ZeRO-1: each rank's part starts one element late "
     "(a parameter of every boundary updated by two ranks, one by none)",
     "ShardRun r = {begin + (size_t)z->rank * s->part, state, s->part};",
     "ShardRun r = {begin + (size_t)z->rank * s->part + (z->rank > 0), state, s->part};"),
    ("rank_reads_rank0_slice", "data parallel", "llama3.h", "every rank reads rank 0's slice of the global batch "
     "(the ranks train on the same tokens)",
     "int slot = l->cfg.overfit_single_batch ? l->cfg.rank : l->micro * l->cfg.world + l->cfg.rank;",
     "int slot = l->cfg.overfit_single_batch ? 0 : l->micro * l->cfg.world;"),
    ("rendezvous_hash_unchecked", "data parallel", "llama3.h", "a rank launched with other flags joins rank 0's run "
     "(the configuration hash not compared)",
     "if (got->world != world || got->config_hash != hash)", "if (got->world != world)"),
    ("resume_takes_latest_only", "checkpoints", "llama3.h", "--resume DIR takes the folder latest names, though a "
     "save killed after its state.bin left a newer complete one (the resumed run then meets it and is refused)",
     "    for (int i = n - 1; i >= 0 && newest < 0; i--)\n", "    if (f) newest = checkpoint_step_of(name);\n"
     "    for (int i = n - 1; i >= 0 && newest < 0; i--)\n"),
    ("old_gpus_taken", "gpu", "llama3.h", "a GPU of compute capability 7.x is taken",
     "if (major * 10 + minor < LLAMA3_MIN_COMPUTE_CAPABILITY)", "if (major < 7)"),
    ("clip_not_deferred", "step plan", "llama3.h", "with clipping only layers 0..11 are deferred: the other groups "
     "are overlapped, and their AdamW would start before the global norm is known",
     "can_defer && (p.measure_norm || (g >= 1 && g < 1 + k))", "can_defer && (g >= 1 && g < 1 + k)"),
    ("list_switches_first_only", "flags", "llama3.h", "--list_switches prints only the first ablation value of each "
     "switch (--grad_zeroing fill and --deferred_adamw 1 drop out of the tests and the ablation)",
     'v = strtok(NULL, " ")) fprintf(f, "%s %s\\n", FLAGS[i].name, v);',
     'v = NULL) fprintf(f, "%s %s\\n", FLAGS[i].name, v);'),
    ("plot_second_log_overwritten", "plots", "scripts/plot_log.py", "plot_log.py with several logs guards only "
     "the first against being the output (the second one is overwritten by the figure)",
     "fmt)], args.logs)", "fmt)], args.logs[:1])"),
    ("tied_header_not_read", "tied embeddings", "llama3.h", "the seed header's tied_embeddings slot not read: a "
     "tied file is taken as untied (and refused for its size)",
     "c.tied_embeddings = read_i32(h, 64);", "c.tied_embeddings = 0;"),
    ("tied_keeps_sparse_embedding", "tied embeddings", "llama3.h", "a tied model keeps --sparse_embedding 1: the "
     "lazy AdamW would update only the rows the batch touched of a dense gradient",
     "    if (c->tied_embeddings) s.sparse_embedding = 0;\n", ""),
    ("plan_ranks_counted_by_loss_guard", "data parallel", "llama3.h", "under several ranks each rank's loss guard "
     "counts the step before the ranks agree on the loss (a rank with a finite loss counts a good step that another "
     "rank's NaN skips)", "world > 1 ? COUNTED_AFTER_RANKS : COUNTED_BY_LOSS_GUARD;", "COUNTED_BY_LOSS_GUARD;"),
    ("fp8_micro_steps_refused", "fp8", "llama3.h", "--fp8 1 refuses micro-steps again (\"takes one micro-step "
     "per step\", as before it accumulated its weight gradients)",
     "    return fp8_check(c, (long long)a->loop.batch_size * a->loop.sequence_length, &a->sw, err);",
     "    if (micro_steps(&a->loop) > 1) return l3_fail(err, \"--fp8 1 takes one micro-step per step\");\n"
     "    return fp8_check(c, (long long)a->loop.batch_size * a->loop.sequence_length, &a->sw, err);"),
    ("fp8_width_unchecked", "fp8", "llama3.h", "--fp8 1 takes a model whose widths the 64 x 64 transpose tiles do "
     "not divide", "    if (c->n_embd % 64 || qkv_dim(c) % 64 || c->ffn_hidden % 64)\n", "    if (0)\n"),
    ("flag_default_undocumented", "flags", "llama3.h", "--checkpoint_keep's default changed to 3 in FLAGS: the "
     "README's flag table still says 2",
     '{"--checkpoint_keep", FLAG_INT, ARG(ckpt.keep), "2",', '{"--checkpoint_keep", FLAG_INT, ARG(ckpt.keep), "3",'),
    # issue 45's last bad inputs: each refused in one line, before the GPU or before any work
    ("log_file_directory_taken", "log", "llama3.h", "a --log_file that is a directory passes the checks (and fails "
     "only when it opens, after the GPU start and the model load)",
     "    if (log_file_kind_check(o->path, o->kind == OUT_LOG_CONTINUED, why)) return -2; // (a whole message of its own)\n",
     ""),
    ("short_token_file_truncated", "inputs", "llama3.h", "a token file shorter than its header is read as one (a "
     "42-byte text file: a bad magic, or a count against a size less the header)",
     "    if (nbytes < 1024) return shorter_than_header(name, \"token file\", nbytes, 1024, err);\n", ""),
    ("out_dir_parents_made", "scripts", "scripts/safe_write.py", "an output folder whose parent is missing passes "
     "the check: prepare_data.py and export_hf.py stop only after their work, when the folder is made",
     'return f"its folder {folder} does not exist (only the last folder of a path is made)"', "return None"),
    ("out_dir_made_before_work", "scripts", "scripts/prepare_data.py", "prepare_data.py makes --out_dir before "
     "tokenizing: a run that then stops leaves an empty folder",
     "            refuse_input(out, files + inputs)\n    shard_stem",
     "            refuse_input(out, files + inputs)\n    make_folders(args)\n    shard_stem"),
    ("hf_dir_missing_as_no_config", "scripts", "scripts/convert_hf.py", "convert_hf.py on a folder that does not "
     "exist says it has no config.json", "    if not os.path.isdir(hf_dir):\n", "    if os.path.isfile(hf_dir):\n"),
    # The scripts' --help and argument errors (scripts/test_help.py).
    ("help_runs_the_script", "scripts", "scripts/check_loss_falls.sh", "check_loss_falls.sh does not look at its "
     "arguments: --help launches the trainer", 'no_arguments "$@"\n', ""),
    ("shell_argument_ignored", "scripts", "scripts/cli.sh", "a shell script that takes no arguments ignores an "
     "unknown one and does its work", '-h | --help) usage ;; *) unknown_argument "$1" ;; esac',
     "-h | --help) usage ;; esac"),
    ("python_argument_ignored", "scripts", "scripts/cli.py", "the Python scripts take an unknown argument and go on "
     "without it", "        for a in args:\n", "        return self.parse_known_args(args, namespace)[0]\n        for a in args:\n"),
    ("torch_before_arguments", "scripts", "scripts/ref_llama3.py", "ref_llama3.py imports torch before it parses its "
     "arguments: no --help without torch",
     "    ARGS = parse_args()  # (before torch's import", "    import torch\n    ARGS = parse_args()  # (before torch's import"),
    ("checkpoint_dir_unchecked", "scripts", "scripts/bench_checkpoint.sh", "bench_checkpoint.sh takes a folder of "
     "another run's checkpoints, and deletes them at its end", 'if [ -n "$dir" ] && [ -e "$dir" ] &&', "if false &&"),
    # The README's recipes (run_tests.sh readme_recipes; make test-recipes runs them on a GPU).
    ("recipe_flag_typo", "docs", "README.md", "a README recipe names a flag the trainer does not have",
     "--warmup_iters 50 --grad_clip 1", "--warmup_iter 50 --grad_clip 1"),
    ("recipe_check_step_commas", "docs", "scripts/test_recipes.sh", "the recipes' log check reads the step "
     "numbers with their commas (\"1,\"), so that no whole log passes (as on the H100, 2026-12-06)",
     "| tr -dc '0-9\\n' |", "| cut -d' ' -f2 |"),
    ("slurm_job_tasks_as_world", "data parallel", "llama3.h", "the world size read from SLURM_NTASKS (the job's) "
     "before the step's SLURM_STEP_NUM_TASKS: srun's tasks of a step smaller than the job wait for ranks that "
     "never come", '{"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}', '{"SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"}'),
    ("shard_steps_without_last_target", "data", "llama3.h", "a shard's steps counted without the last step's "
     "last target: a shard of a whole number of steps reads one token past its end",
     "return n ? (n - 1) / l->group_tokens : 0;", "return n / l->group_tokens;"),
    ("dry_run_ignored", "cli", "train_llama3.cu", "--dry_run 1 ignored: the run goes on to the GPU (and trains, "
     "where there is one)", "    if (a.loop.dry_run) return dry_run(&a, &cfg, &ranks);\n", ""),
    ("dry_run_one_rank_memory", "cli", "train_llama3.cu", "--dry_run 1 sizes a rank of several as one rank: "
     "its AdamW state whole, not its ZeRO-1 share",
     "model_size(&m, cfg, &run, ranks->world > 1 ? &shard : NULL, DRY_RUN_SMS);",
     "model_size(&m, cfg, &run, NULL, DRY_RUN_SMS);"),
    ("memory_without_overhead", "cli", "train_llama3.cu", "the memory check counts the buffers alone, not what "
     "a run takes beside them (code, libraries): the 3B at B=8, T=1024 passes it and runs out of memory at the "
     "start (H100, 2026-12-07)", "#define RUN_OVERHEAD_BYTES ((size_t)1 << 30)", "#define RUN_OVERHEAD_BYTES ((size_t)0)"),
    ("run_config_one_micro_step", "cli", "llama3.h", "run_config gives model creation one micro-step whatever "
     "--total_batch_size says", "RunConfig r = {l->batch_size, l->sequence_length, micro_steps(l),",
     "RunConfig r = {l->batch_size, l->sequence_length, 1,"),
    # The tensor table (llama3.h tensor_table): what a slot or group change would do to the step.
    ("sumsq_slots_by_tensor", "layout", "llama3.h", "the sum-of-squares slots numbered tensor by tensor instead "
     "of layer by layer: still one each, but the norm's reduction order, and so its bits, change",
     "s->sumsq_slot = stacked ? 3 + l * per_layer + (t - P_QKV) :", "s->sumsq_slot = stacked ? 3 + (t - P_QKV) * L + l :"),
    ("head_group_lm_head_first", "layout", "llama3.h", "lm_head taken before the final norm in the head's update group",
     "P_ATTN_NORM, P_FFN_NORM, P_FINAL_NORM, P_LM_HEAD};", "P_ATTN_NORM, P_FFN_NORM, P_LM_HEAD, P_FINAL_NORM};"),
    # A case that blocks fails by its own time limit (test_llama3_host.c CASE_LIMIT_S), not by a hang.
    ("fifo_open_blocks", "files", "llama3.h", "model and token files opened blocking: the open of a FIFO waits for "
     "a writer that never comes", "int fd = open(path, O_RDONLY | O_NONBLOCK);", "int fd = open(path, O_RDONLY);"),
    ("rendezvous_file_waits_forever", "data parallel", "llama3.h", "a rank waiting for rank 0's rendezvous file never "
     "gives up", "        if (monotonic_seconds() > end)\n            return l3_fail(err, \"--rendezvous file:%s: rank 0",
     "        if (0)\n            return l3_fail(err, \"--rendezvous file:%s: rank 0"),
]

# Bugs of a kernel caught by its dev/ benchmark's --check (the last field): --dev builds only that
# binary in the copy and runs its check (the FP8 kernels' own bugs; the trainer's FP8 path has its
# mutants in MUTANTS).
DEV_MUTANTS = [
    ("weight_draw_shares_v_bits", "bf16 weights", "kernels.cuh", "the stochastic rounding of a bf16 weight takes "
     "its v's 16 bits: the two round up together", "#define ROUND_W 32", "#define ROUND_W 16", "dev/adamw"),
    ("float4_elements_share_draw", "bf16 weights", "kernels.cuh", "AdamW's float4 path draws one rounding stream "
     "value for its 4 elements: neighbours round alike", "        bits[e] = update_bits<P, M>(element + e, h.t);",
     "        bits[e] = update_bits<P, M>(element, h.t);", "dev/adamw"),
    ("fp8_scale_twice", "fp8", "kernels.cuh", "FP8 quantisation multiplies by the scale twice",
     "return __nv_cvt_float_to_fp8(x * scale, __NV_SATFINITE", "return __nv_cvt_float_to_fp8(x * scale * scale, __NV_SATFINITE",
     "dev/fp8_quantize"),
    ("fp8_e4m3_for_e5m2", "fp8", "kernels.cuh", "gradients (e5m2) encoded as e4m3",
     "static constexpr __nv_fp8_interpretation_t interp = __NV_E5M2;",
     "static constexpr __nv_fp8_interpretation_t interp = __NV_E4M3;", "dev/fp8_quantize"),
    ("fp8_no_saturation", "fp8", "kernels.cuh", "values past the format's largest finite one not saturated (a stale, "
     "smaller amax turns them into NaN or inf)", "__NV_SATFINITE, Fp8Format<F8>::interp", "__NV_NOSAT, Fp8Format<F8>::interp",
     "dev/fp8_quantize"),
    ("fp8_tile_not_transposed", "fp8", "kernels.cuh", "the transposing quantiser stores its tile untransposed",
     "tile[c + e][r] = b[e]", "tile[r][c + e] = b[e]", "dev/fp8_quantize"),
    ("fp8_gemm_one_scale_twice", "fp8", "kernels.cuh", "the FP8 GEMM multiplies by one operand's inverse scale twice "
     "(the other's dropped)", "B_SCALE_POINTER, &a_scale_inv,", "B_SCALE_POINTER, &b_scale_inv,", "dev/fp8_gemm"),
    ("fp8_quantize_straight_skipped", "fp8", "kernels.cuh", "the one-pass quantiser writes only the transposed copy",
     "        *(uint2*)(out + at) = packed;\n", "", "dev/fp8_quantize"),
    ("swiglu_amax_gate_only", "fp8", "kernels.cuh", "the SwiGLU backward's fused amax sees d_gate only, not d_up",
     "fmaxf(fabsf(__bfloat162float(dg.v[e])), fabsf(__bfloat162float(du.v[e])))", "fabsf(__bfloat162float(dg.v[e]))",
     "dev/swiglu"),
    ("rmsnorm_amax_unrounded", "fp8", "kernels.cuh", "the RMSNorm forward's fused amax taken before the bf16 "
     "rounding (the FP8 scale off the tensor the GEMM reads)",
     "if (amax_bits) block_amax(amax_bits, round_bf16(amax)); // (uniform: every",
     "if (amax_bits) block_amax(amax_bits, amax); // (uniform: every", "dev/rmsnorm"),
    # [document mask] the tile skipping's boundaries and the spans' scan, each wrong on few elements
    ("doc_skip_tile_rounded_up", "document mask", "kernels.cuh", "--doc_mask 1, flash forward and dQ: the first "
     "key tile rounded up from the query tile's first document start (one tile short unless the start is a "
     "tile's first key)", "    return doc_first<DOC_MASK>(docs, b, qt * FA_TILE, T) / FA_TILE;",
     "    return (doc_first<DOC_MASK>(docs, b, qt * FA_TILE, T) + FA_TILE - 1) / FA_TILE;", "dev/attention"),
    ("doc_query_tiles_short", "document mask", "kernels.cuh", "--doc_mask 1, flash dK/dV: the last query tile "
     "found from end - 2, one tile short when the last key's document ends just past a tile boundary (its last "
     "query is a tile's first)", "    return doc_last<DOC_MASK>(docs, b, min(kt * FA_TILE + FA_TILE - 1, T - 1), T) / FA_TILE + 1 - kt;",
     "    return (doc_last<DOC_MASK>(docs, b, min(kt * FA_TILE + FA_TILE - 1, T - 1), T) - 1) / FA_TILE + 1 - kt;",
     "dev/attention"),
    # [sm_90] the wgmma kernels (dev/attention version 5): a tile boundary, the document mask, a scale
    ("wgmma_key_tile_off_by_one", "sm_90 attention", "kernels.cuh", "wgmma forward and dQ: each K tile copied "
     "from one row past its first (a tile boundary off by one)", "sm.k[s].load(k_map, &sm.k_full[s], j * Tiles::KEYS, kvh, b);",
     "sm.k[s].load(k_map, &sm.k_full[s], j * Tiles::KEYS + 1, kvh, b);", "dev/attention"),
    ("wgmma_doc_mask_leaks", "sm_90 attention", "kernels.cuh", "--doc_mask 1, wgmma forward: a tile below a query's "
     "document start left unmasked unless it is the diagonal tile (the mask leaks across documents)",
     "if (key0 + FA90_TILE - 1 > row0 || key0 < last_first_key) mask_scores",
     "if (key0 + FA90_TILE - 1 > row0) mask_scores", "dev/attention"),
    ("wgmma_doc_skip_rounded_up", "sm_90 attention", "kernels.cuh", "--doc_mask 1, wgmma forward and dQ: the first "
     "key tile rounded up from the block's first document start",
     "return KeyRange{doc_first<DOC_MASK>(docs, b, q0, T) / KEYS,",
     "return KeyRange{(doc_first<DOC_MASK>(docs, b, q0, T) + KEYS - 1) / KEYS,", "dev/attention"),
    ("wgmma_doc_steps_short", "sm_90 attention", "kernels.cuh", "--doc_mask 1, wgmma dK/dV: the last query step "
     "found from end - 2 (one step short when the last key's document ends just past a step's first query)",
     "tiles = doc_last<DOC_MASK>(docs, b, k0 + FA90_TILE - 1, sh.T) / FA90_STEP - first + 1;",
     "tiles = (doc_last<DOC_MASK>(docs, b, k0 + FA90_TILE - 1, sh.T) - 1) / FA90_STEP - first + 1;", "dev/attention"),
    ("wgmma_dq_10pct", "sm_90 attention", "kernels.cuh", "wgmma dQ: 10 % too large",
     "kv_free[s]);\n    }\n    store_head_rows<HD>(dq + (size_t)bh * T * HD, dq_acc, row, T, scale);",
     "kv_free[s]);\n    }\n    store_head_rows<HD>(dq + (size_t)bh * T * HD, dq_acc, row, T, 1.1f * scale);",
     "dev/attention"),
    ("wgmma_dk_unscaled", "sm_90 attention", "kernels.cuh", "wgmma dK/dV: dK stored without its 1/sqrt(HD) (the "
     "wrong scale in the backward)", "    store_head_rows<HD>(dk + kv_head, dk_acc, key, sh.T, scale);",
     "    store_head_rows<HD>(dk + kv_head, dk_acc, key, sh.T, 1.0f);", "dev/attention"),
    ("doc_spans_carry_dropped", "document mask", "kernels.cuh", "doc_spans: the scan's carry is the last chunk's "
     "max, not the running max, so a chunk of 4096 positions without BOS forgets the document before it",
     "        carry = max(carry, chunk_max);", "        carry = chunk_max;", "dev/attention"),
]


def copy_tree(dest):
    # the tree as make sees it: tracked files, and new ones not yet committed (not the ignored build outputs)
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(dest, f))  # mtimes kept: ref/ stays newer than the script
    os.symlink(os.path.join(ROOT, "ref"), os.path.join(dest, "ref"))


def plant(dest, mutant):
    name, _, path, _, old, new = mutant[:6]
    full = os.path.join(dest, path)
    text = open(full).read()
    if text.count(old) != 1:
        sys.exit(f"mutant {name}: its code occurs {text.count(old)} times in {path} (expected once): update it")
    open(full, "w").write(text.replace(old, new))


def plant_check(mutants):
    """Each mutant's code must occur exactly once in the tree as it is: code that moved leaves a
    mutant that plants nothing."""
    stale = [f"{m[0]} ({m[2]}: {open(os.path.join(ROOT, m[2])).read().count(m[4])} times)" for m in mutants
             if open(os.path.join(ROOT, m[2])).read().count(m[4]) != 1]
    for line in stale:
        print(f"FAIL mutant {line}: its code must occur exactly once")
    if not stale:
        print(f"ok   every one of the {len(mutants)} mutants plants its bug (its code occurs exactly once)")
    print(f"{0 if stale else 1} passed, {len(stale)} failed")
    sys.exit(1 if stale else 0)


def build(dest, host_only, gpu_only, data_parallel):
    # a data-parallel mutant needs only the trainer (NCCL_HOME, if set, passes through to make)
    targets = ["train_llama3"] if data_parallel else ["train_llama3", "test_llama3_host"] + ([] if host_only else ["test_llama3"])
    gencode = GENCODE.split(" -gencode arch=compute_80")[0] if gpu_only else GENCODE  # (the PTX check is a host part)
    extra = ["DATA_PARALLEL=1"] if data_parallel else []
    r = subprocess.run(["make", "-s", "-j3", *targets, f"GENCODE={gencode}", *extra], cwd=dest, capture_output=True,
                       text=True)
    return r.returncode, r.stdout + r.stderr


# "FAIL what err (tol T)", and test_ranks.sh's "FAIL what, largest relative difference err (tol T): detail"
FAIL_CHECK = re.compile(r"^FAIL (.*?)\s+([-+0-9.e]+|inf|nan) \(tol ([-+0-9.e]+)\)(?:: .*)?$")


def first_failure(output):
    """(part, check, error, tolerance) of the first FAIL line and the '== part' header above it."""
    part = ""
    for line in output.splitlines():
        if line.startswith("== "):
            part = line[3:].split(":")[0]
        elif line.startswith("FAIL"):
            m = FAIL_CHECK.match(line.strip())
            if m:
                return part, m.group(1).strip(), m.group(2), m.group(3)
            return part, line[5:].strip()[:100], "", ""
    return None


def dev_check(dest, mutant):
    """DEV_MUTANTS: the mutant's dev/ binary built in the copy and its --check run (rc, output)."""
    binary = mutant[6]
    gencode = GENCODE.split(" -gencode arch=compute_80")[0]
    r = subprocess.run(["make", "-s", binary, f"GENCODE={gencode}"], cwd=dest, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"mutant {mutant[0]} does not build:\n{(r.stdout + r.stderr)[-2000:]}")
    r = subprocess.run([f"./{binary}", "--check"], cwd=dest, capture_output=True, text=True, timeout=900)
    return r.returncode, f"== {binary}\n" + r.stdout + r.stderr


def run_tests(dest, name, gpu_only, host_only, data_parallel):
    # LLAMA3_MUTANT: run_tests.sh leaves its plant check out (the copy lacks the mutant's own code)
    env = dict(os.environ, LLAMA3_MUTANT=name, LLAMA3_FAIL_FAST="1", LLAMA3_TEST_SHAPES="small", LLAMA3_DEV_CHECKS="0",
               LLAMA3_HOST_TESTS="0" if gpu_only else "1", LLAMA3_GPU_TESTS="0" if host_only else "1")
    # a data-parallel mutant runs only the two-rank part (its header is printed here: it has none of its own)
    head, script = ("== two ranks\n", "scripts/test_ranks.sh") if data_parallel else ("", "scripts/run_tests.sh")
    r = subprocess.run(["bash", script], cwd=dest, env=env, capture_output=True, text=True,
                       errors="replace", timeout=900)  # (samples print raw token bytes)
    return r.returncode, head + r.stdout + r.stderr


def main():
    ap = ArgumentParser(__file__, description="\n\n".join(__doc__.split("\n\n")[:2]))  # (what, and examples)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--only", nargs="*", help="mutant names")
    ap.add_argument("--gpu_only", action="store_true", help="leave the host tests out")
    ap.add_argument("--host_only", action="store_true", help="HOST_MUTANTS, with the GPU tests left out (no GPU needed)")
    ap.add_argument("--data_parallel", action="store_true", help="DP_MUTANTS, built with DATA_PARALLEL=1 (a GPU and NCCL)")
    ap.add_argument("--dev", action="store_true", help="DEV_MUTANTS, each caught by its dev/ binary's --check (a GPU)")
    ap.add_argument("--out", help="also write the table (markdown) here")
    ap.add_argument("--keep", help="build the copies in this folder and keep them")
    ap.add_argument("--plant_check", action="store_true",
                    help="only check that every mutant's code occurs exactly once (no GPU; make test runs it)")
    args = ap.parse_args()
    if args.plant_check:
        plant_check(MUTANTS + HOST_MUTANTS + DP_MUTANTS + DEV_MUTANTS)
    if args.dev:
        return dev_main(args)
    pool_of = HOST_MUTANTS if args.host_only else DP_MUTANTS if args.data_parallel else MUTANTS
    mutants = [m for m in pool_of if not args.only or m[0] in args.only]
    refs = () if args.host_only else ("small_t64",) if args.data_parallel else (
        "small_t64", "small_t1024", "small_b8", "small_accum", "small_dense", "small_tied", "small_hd128", "small_fp8",
        "small_fp8_e4m3", "small_docs")
    for ref in refs:
        if not os.path.exists(os.path.join(ROOT, "ref", f"{ref}_state.bin")):
            sys.exit(f"ref/{ref}_state.bin is missing: run `make test` on this GPU machine first")
    base = args.keep or tempfile.mkdtemp(prefix="mutants_")
    dests = [os.path.join(base, m[0]) for m in mutants]
    for dest, m in zip(dests, mutants):
        shutil.rmtree(dest, ignore_errors=True)
        copy_tree(dest)
        plant(dest, m)
    pool = cf.ThreadPoolExecutor(args.jobs)  # the copies build while the earlier ones' tests run
    builds = [pool.submit(build, d, args.host_only, args.gpu_only, args.data_parallel) for d in dests]
    rows, survived = [], 0
    for dest, m, built in zip(dests, mutants, builds):
        rc, log = built.result()
        if rc != 0:
            pool.shutdown(cancel_futures=True)
            sys.exit(f"mutant {m[0]} does not build:\n{log[-2000:]}")
        rc, out = run_tests(dest, m[0], args.gpu_only, args.host_only, args.data_parallel)  # one at a time: the default runs fill the GPU
        survived += add_row(rows, m, rc, out)
    pool.shutdown()
    finish(rows, len(mutants), survived, args, base)


def add_row(rows, m, rc, out):
    """The mutant's table row from its tests' exit code and output (printed at once); True if it survived."""
    hit = first_failure(out) if rc != 0 else None
    part, check, err, tol = hit or ("SURVIVED", "", "", "")
    rows.append(f"| {m[0]} | {m[1]} | {m[3]} | {part} | {check} | {err} | {tol} |")
    print(rows[-1], flush=True)
    return hit is None


def finish(rows, n, survived, args, base):
    table = "\n".join(["| mutant | kind | the bug | first failing part | first failing check | error | tolerance |",
                       "|---|---|---|---|---|---|---|", *rows])
    print(f"\n{table}\n\n{n - survived} of {n} mutants caught")
    if args.out:
        open(args.out, "w").write(table + "\n")
    if not args.keep:
        shutil.rmtree(base)
    sys.exit(1 if survived else 0)


def dev_main(args):
    mutants = [m for m in DEV_MUTANTS if not args.only or m[0] in args.only]
    base = args.keep or tempfile.mkdtemp(prefix="mutants_")
    rows, survived = [], 0
    for m in mutants:
        dest = os.path.join(base, m[0])
        shutil.rmtree(dest, ignore_errors=True)
        copy_tree(dest)
        plant(dest, m)
        survived += add_row(rows, m, *dev_check(dest, m))
    finish(rows, len(mutants), survived, args, base)


if __name__ == "__main__":
    main()
