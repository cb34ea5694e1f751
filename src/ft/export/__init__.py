"""``ft export``: a trained run or a model directory written for another runtime. One module per target: ``gguf`` (one
GGUF file for llama.cpp, Ollama and LM Studio: ``gguf_file`` writes the tensors, ``gguf_vocab`` the tokenizer,
``modelfile`` Ollama's Modelfile). Import the modules themselves; this package imports nothing."""
