// flexpar/sbp/ops.hpp — every op on global tensors, whose output SBP is deduced from the inputs'
// SBPs. Each op has a signature table per mesh axis (as values in signature.hpp); an nd-SBP input
// works when every mesh axis has a signature, and the output takes each axis's result. For static
// SBPs the output type is computed at compile time; a combination with no signature is a compile
// error that says what is missing and names, in its template arguments, the boxing that would fix it
// (try_to<Left, Right>). Ops never communicate — boxing does. Each op is written once for every
// memory (backend.hpp): the local math is the tensor's backend's kernel, its result's shard from the
// placement's pool (a training loop whose tensors die each step reuses their buffers).
//
// The ops, filed by what they are (each file's header has its table):
//   ops/linear_algebra.hpp   matmul, transpose, embedding, embedding_grad
//   ops/elementwise.hpp      add, mul, relu, gelu, gelu_grad
//   ops/along_axis.hpp       softmax, layer_norm, reduce_sum, softmax_grad, layer_norm_grad
//   ops/attention_loss.hpp   causal_attention(_grad), cross_entropy(_grad)
//   ops/convolution.hpp      conv2d, conv2d_grad_input, conv2d_grad_weight
//
// The backward of an op that is linear in its output gradient keeps a partial dy partial: a
// Megatron column-parallel block's input gradient comes out P(sum) and one boxing (P -> B, an
// allreduce) ends it, and a data-parallel weight gradient comes out P(sum) over the data axis —
// the gradient allreduce of data parallelism is a boxing the types ask for, not a separate step.
#pragma once

#include <flexpar/sbp/ops/along_axis.hpp>
#include <flexpar/sbp/ops/attention_loss.hpp>
#include <flexpar/sbp/ops/common.hpp>
#include <flexpar/sbp/ops/convolution.hpp>
#include <flexpar/sbp/ops/elementwise.hpp>
#include <flexpar/sbp/ops/linear_algebra.hpp>
