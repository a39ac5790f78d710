"""Reference implementations, data generators, plots, widgets and grading checks
for the attention and transformers workbook.

Conventions, in every module: batch first (``(B, T, D)``); masks are boolean with True
meaning "may attend"; attention functions and layers return ``(output, weights)``.

Modules, one idea each:

- ``course_lib.device``     device choice, seeding and scoped thread counts
- ``course_lib.rnn``        vanilla RNN step/forward, Jacobian norms, the fixed-context seq2seq model
- ``course_lib.bahdanau``   attention scores, masked softmax, context vector, Bahdanau attention, GRU seq2seq
- ``course_lib.seq2seq``    loss and greedy evaluation of the RNN encoder-decoders
- ``course_lib.training``   the training loop of every notebook: progress bar, loss history, schedules
- ``course_lib.data``       offline data sets (dates, copy task, toy translation, scenes of shapes) and vocabularies
- ``course_lib.attention``  scaled dot-product attention, masks, single-head self-attention
- ``course_lib.multihead``  multi-head attention, head split/merge, head ablation, diversity penalty
- ``course_lib.positional`` sinusoidal, learned, relative (Shaw et al.) and rotary positions (RoPE's angles and rotation)
- ``course_lib.transformer`` LayerNorm, FFN, encoder/decoder layers (post-/pre-LN), stacks, the full model
- ``course_lib.optim``      the warm-up (Noam) schedule and label-smoothed cross-entropy
- ``course_lib.decoding``   teacher forcing, greedy decoding, beam search with a length penalty
- ``course_lib.bleu``       corpus BLEU (Papineni et al.)
- ``course_lib.synthetic_tasks`` small generated sequence tasks (offset digits, sortedness)
- ``course_lib.bert``       BERT's input (MLM masking, sentence pairs), embeddings, encoder, MLM and NSP heads, a classifier
- ``course_lib.bert_pretraining`` pre-training data and runs (MLM + NSP), their metrics, fine-tuning, probes per layer
- ``course_lib.gpt``        pre-LN GPT block, GPT model with tied embeddings, parameter counts (GPT-2, GPT-3)
- ``course_lib.sampling``   greedy/temperature/top-k next-token sampling and ``generate`` with context cropping
- ``course_lib.icl``        in-context task samplers, a small ICL transformer, a nearest-centroid baseline, few-shot accuracy
- ``course_lib.induction``  repeated-random-token data, attention-only transformers, induction scores
- ``course_lib.efficient_attention`` local/dilated/global masks, sliding-window and tiled (online-softmax) attention, KV cache, Performer features, linear attention
- ``course_lib.long_context`` a one-layer model with full, windowed or window + global attention for long inputs
- ``course_lib.cost``       time and memory of attention as the sequence grows
- ``course_lib.vision``     patches (patchify/unpatchify), the ViT's patch embedding, soft visual attention, the doubly stochastic penalty, attention rollout, pointing accuracy
- ``course_lib.captioning`` Show, Attend and Tell on generated scenes: a CNN encoder, an attending GRU decoder, training and greedy captions
- ``course_lib.vit``        a tiny Vision Transformer and a CNN of the same size for a relational question, their training and attentions
- ``course_lib.modern``     the modern decoder block: RMSNorm, SwiGLU, repeat_kv, grouped-query attention, cache sizes, published shapes
- ``course_lib.modern_lm``  a character language model of modern blocks (or a student's), story characters, training and length tests
- ``course_lib.tiny_models`` a small configurable attention model and ``fit``, the training loop set up for it
- ``course_lib.plotting``   heatmaps and curves used by the notebooks
- ``course_lib.widgets``    the interactive attention explorer
- ``course_lib.grading``    check specs, mistake catalogues and the ``check`` entry point
- ``course_lib.notebook_client`` a notebook run top to bottom with nbclient, without its stalls on Output widgets
"""

__version__ = "0.1.0"
