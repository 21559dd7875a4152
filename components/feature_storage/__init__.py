"""How feature rows are stored between partition and model: float32, float16, bfloat16 or int8.

:mod:`.quantization` fits int8's per-column affine parameters from value ranges (numpy only,
for preprocess); :mod:`.codec` encodes float32 rows into the stored type and decodes them back
(torch, for partition, the samplers' consumers and serving).
"""
