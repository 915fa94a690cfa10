"""Accuracy benches: predicted iteration times against published ones (SC'21 Table 1, the
published runs split for calibration) and where published plans rank in the search
(SC'21, Megatron-Bridge's Llama-3.1 405B, NeMo's context-parallel degrees), and Megatron-LM's
own ``pretrain_gpt.py`` on one GPU through the launch scripts (:mod:`.megatron_gpu`)."""
