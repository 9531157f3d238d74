"""Multimodal input as a deterministic, recorded stage: image bytes -> header -> decoded RGB -> a family's
pixel values, grid and placeholder tokens. One module per model family (`qwen2vl`, `pixtral`, `llava`); the
values and the family interface are in `base`, bytes and Pillow in `media`. Depends only on `request` values,
`frozen` and `errors`.
"""
