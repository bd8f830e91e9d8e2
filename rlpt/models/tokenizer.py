"""Tokenizer: HF `tokenizers` for the text <-> ids map, jinja2 for the chat template.

Built from a checkpoint directory (`tokenizer.json` + `tokenizer_config.json`) or
from a GGUF's BPE metadata (vocab, merges, token types), the latter the way HF
transformers converts a byte-level ("gpt2") GGUF vocabulary: a BPE model over the
byte-level alphabet, GPT-2's byte-level pre-tokenizer (or the split regex the file's
`tokenizer.ggml.pre` names), a byte-level decoder, and every token the file marks
as control added whole as a special token.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any, Sequence

import jinja2
import jinja2.sandbox
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

# The split regexes llama.cpp's `tokenizer.ggml.pre` names that differ from GPT-2's.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
               "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT,
               "deepseek-r1-qwen": _QWEN2_SPLIT}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte -> printable character table (the byte-level BPE alphabet)."""
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
      list(range(ord("®"), ord("ÿ") + 1))
  chars, n = list(keep), 0
  for b in range(256):
    if b not in keep:
      keep.append(b)
      chars.append(256 + n)
      n += 1
  return {b: chr(c) for b, c in zip(keep, chars)}


class Tokenizer:
  """Text <-> token ids, plus the model's chat template.

  Attributes:
    backend: the `tokenizers.Tokenizer`.
    chat_template: jinja2 source, or None.
    special_tokens: {"bos_token", "eos_token", "unk_token", "pad_token"} -> str or None.
  """

  def __init__(self, backend: tokenizers.Tokenizer, *, chat_template: str | None = None,
               special_tokens: dict[str, str | None] | None = None,
               add_bos_token: bool = False, source: str = "<memory>"):
    self.backend = backend
    self.chat_template = chat_template
    self.special_tokens = dict(special_tokens or {})
    self.add_bos_token = add_bos_token
    self.source = source
    self._template = None

  # --- ids --------------------------------------------------------------------------------
  def _id(self, name: str) -> int | None:
    tok = self.special_tokens.get(name)
    return None if tok is None else self.backend.token_to_id(tok)

  @property
  def bos_token_id(self) -> int | None:
    return self._id("bos_token")

  @property
  def eos_token_id(self) -> int | None:
    return self._id("eos_token")

  @property
  def pad_token_id(self) -> int | None:
    return self._id("pad_token")

  @property
  def vocab_size(self) -> int:
    """Number of ids (base vocabulary plus added tokens)."""
    return self.backend.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of `text` (BOS first when the model's tokenizer adds one)."""
    ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
    bos = self.bos_token_id
    if add_special_tokens and self.add_bos_token and bos is not None and ids[:1] != [bos]:
      ids = [bos] + ids
    return ids

  def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
    return [self.encode(t, add_special_tokens) for t in texts]

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  # --- chat -------------------------------------------------------------------------------
  def apply_chat_template(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
                          tokenize: bool = False, **extra):
    """Renders `messages` with the model's jinja2 chat template (HF's conventions)."""
    if self.chat_template is None:
      raise ValueError(f"tokenizer from {self.source} has no chat template")
    if self._template is None:
      env = jinja2.sandbox.ImmutableSandboxedEnvironment(
          trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
      env.filters["tojson"] = lambda x, indent=None, **k: json.dumps(x, ensure_ascii=False,
                                                                    indent=indent)
      env.globals["raise_exception"] = _raise
      env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
      self._template = env.from_string(self.chat_template)
    text = self._template.render(messages=list(messages),
                                 add_generation_prompt=add_generation_prompt,
                                 **{k: v for k, v in self.special_tokens.items()}, **extra)
    return self.encode(text, add_special_tokens=False) if tokenize else text

  # --- construction -----------------------------------------------------------------------
  @classmethod
  def from_gguf_metadata(cls, meta: dict[str, Any], source: str) -> "Tokenizer":
    """From a GGUF's `tokenizer.ggml.*` keys (byte-level BPE, llama.cpp's "gpt2" model)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
      raise ValueError(f"{source}: tokenizer.ggml.model={kind!r} is not supported "
                       "(only byte-level BPE, 'gpt2')")
    if "tokenizer.ggml.tokens" not in meta:
      raise ValueError(f"{source}: metadata key 'tokenizer.ggml.tokens' is missing")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {}
    for i, tok in enumerate(tokens):
      if not set(tok) <= alphabet:
        tok = "".join(spelling[b] for b in tok.encode("utf-8"))
      vocab.setdefault(tok, i)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    split = _PRE_SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
      backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
      backend.pre_tokenizer = pre_tokenizers.Sequence([
          pre_tokenizers.Split(Regex(split), behavior="isolated"),
          pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [AddedToken(t, normalized=False, special=True)
               for t, ty in zip(tokens, types) if ty == _CONTROL and set(t) <= alphabet]
    if control:
      backend.add_special_tokens(control)
    user = [AddedToken(t, normalized=False, special=False)
            for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t in vocab]
    if user:
      backend.add_tokens(user)
    special = {}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
      idx = meta.get(f"tokenizer.ggml.{key}")
      special[name] = tokens[idx] if idx is not None and idx < len(tokens) else None
    return cls(backend, chat_template=meta.get("tokenizer.chat_template"),
               special_tokens=special, add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token",
                                                                    False)), source=source)

  @classmethod
  def from_dir(cls, path: str) -> "Tokenizer":
    """From a checkpoint directory: tokenizer.json (+ tokenizer_config.json if present)."""
    tj = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tj):
      raise FileNotFoundError(f"tokenizer file not found: {tj}")
    try:
      backend = tokenizers.Tokenizer.from_file(tj)
    except Exception as e:  # tokenizers raises plain Exception on bad JSON
      raise ValueError(f"{tj}: cannot parse tokenizer ({e})") from e
    conf: dict[str, Any] = {}
    tc = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(tc):
      with open(tc) as f:
        conf = json.load(f)
    template = conf.get("chat_template")
    tmpl_file = os.path.join(path, "chat_template.jinja")
    if template is None and os.path.isfile(tmpl_file):
      with open(tmpl_file) as f:
        template = f.read()
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
      template = {t["name"]: t["template"] for t in template}.get("default")

    def tok(v):
      return v.get("content") if isinstance(v, dict) else v

    special = {k: tok(conf.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    # A post-processor that prepends BOS (Llama 3's TemplateProcessing) is the backend's business;
    # `add_bos_token` only covers tokenizers whose config asks for it without one.
    add_bos = bool(conf.get("add_bos_token", False)) and backend.post_processor is None
    return cls(backend, chat_template=template, special_tokens=special, add_bos_token=add_bos,
               source=path)

  def save(self, path: str):
    """Writes tokenizer.json, tokenizer_config.json (and the chat template in it)."""
    os.makedirs(path, exist_ok=True)
    self.backend.save(os.path.join(path, "tokenizer.json"))
    conf = {k: v for k, v in self.special_tokens.items() if v is not None}
    conf.update(tokenizer_class="PreTrainedTokenizerFast", add_bos_token=self.add_bos_token,
                model_max_length=1 << 30, clean_up_tokenization_spaces=False)
    if self.chat_template is not None:
      conf["chat_template"] = self.chat_template
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
      json.dump(conf, f, indent=2, ensure_ascii=False)


def _raise(msg):
  raise jinja2.exceptions.TemplateError(msg)


def load_tokenizer(path: str):
  """The tokenizer saved in checkpoint directory `path`: a CharTokenizer where its
  tokenizer_config.json names that class, else `Tokenizer.from_dir`."""
  conf = os.path.join(path, "tokenizer_config.json")
  if os.path.isfile(conf):
    with open(conf) as f:
      if json.load(f).get("tokenizer_class") == CharTokenizer.CLASS:
        return CharTokenizer.from_dir(path)
  return Tokenizer.from_dir(path)


CHAR_SPECIALS = ("<pad>", "<bos>", "<eos>")


def char_backend(chars: Sequence[str]) -> tokenizers.Tokenizer:
  """A character-level HF `tokenizers.Tokenizer`: ids 0..2 are <pad>, <bos>, <eos>,
  then one id per character of `chars` (in order)."""
  vocab = {s: i for i, s in enumerate(CHAR_SPECIALS)}
  for c in chars:
    vocab.setdefault(c, len(vocab))
  tok = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
  tok.decoder = decoders.Fuse()
  tok.add_special_tokens(list(CHAR_SPECIALS))
  return tok


class CharTokenizer:
  """The tokenizer interface rlpt uses (encode / decode / chat template / special ids)
  over a character vocabulary (`char_backend`), for small random models on
  character-level tasks (rlpt.data.synthetic). The chat template is "<bos>" + the last
  user message: the model sees the bare task prompt. `save` / `load_tokenizer` round
  trip it through a checkpoint directory, so rollout servers load it like any other."""

  CLASS = "rlpt.CharTokenizer"
  pad_token_id = 0
  bos_token_id = 1
  eos_token_id = 2

  def __init__(self, chars: Sequence[str]):
    self.chars = tuple(chars)
    self.hf = char_backend(self.chars)

  @property
  def vocab_size(self) -> int:
    return self.hf.get_vocab_size()

  def encode(self, text: str) -> list[int]:
    return self.hf.encode(text).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                          tokenize: bool = False):
    user = [m["content"] for m in messages if m.get("role") == "user"]
    if not user:
      raise ValueError("CharTokenizer.apply_chat_template: no user message")
    text = CHAR_SPECIALS[1] + user[-1]
    return self.encode(text) if tokenize else text

  def save(self, path: str) -> None:
    """Writes tokenizer.json and a tokenizer_config.json naming this class and its chars."""
    os.makedirs(path, exist_ok=True)
    self.hf.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
      json.dump({"tokenizer_class": self.CLASS, "chars": list(self.chars),
                 "bos_token": CHAR_SPECIALS[1], "eos_token": CHAR_SPECIALS[2],
                 "pad_token": CHAR_SPECIALS[0]}, f, indent=1)

  @classmethod
  def from_dir(cls, path: str) -> "CharTokenizer":
    with open(os.path.join(path, "tokenizer_config.json")) as f:
      return cls(json.load(f)["chars"])
