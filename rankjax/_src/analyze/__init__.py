"""``rankjax analyze``: the three papers' measurements on a pretrained checkpoint
(Hugging Face GPT-2 / Llama family) or a rankjax training run."""
