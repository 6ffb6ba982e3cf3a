"""LiT (Zhai et al. 2022), Sec. 6.2 / Table 4: a locked pretrained image tower, a text tower trained from
scratch with a contrastive loss, zero-shot classification (``dpnrepro.evaluation.zeroshot``)."""
