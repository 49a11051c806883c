"""A transformers checkpoint found on the Hugging Face hub or in its local cache, and its tokenizer as meta.json
holds it: what `python -m data.prepare --tokenizer hf:NAME` and hf.py's import (--init_from=hf:NAME) need, which a
plain run never imports.
"""

import socket
import urllib.parse
from pathlib import Path

from config import optional_package


def hf_checkpoint(name: str, where: str) -> str:
    """name, a transformers checkpoint's folder or hub id, as from_pretrained takes it, once it is known to be there:
    a folder must exist; a hub id must be in the local cache, or the hub reachable within a few seconds, so that an
    offline machine fails in one line rather than after transformers' retries. where names the setting the user
    typed (--init_from=hf:NAME, say)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:  # a hub id is NAME or ORG/NAME
        raise ValueError(f"{where}: the folder {name} does not exist")
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str) or constants.HF_HUB_OFFLINE:
        return name  # cached, or offline by choice: transformers reads the cache alone and says what is missing
    hub = urllib.parse.urlsplit(constants.ENDPOINT)
    host = hub.hostname
    try:
        socket.create_connection((host, hub.port or 443), timeout=3).close()
    except OSError as e:
        raise ValueError(
            f"{where}: {name} is not in the local Hugging Face cache and {host} cannot be reached "
            f"({e.strerror or e}); download it where there is a network, or give a local folder"
        ) from None
    return name


def hf_tokenizer_fields(name: str, where: str) -> dict:
    """meta's tokenizer fields of a transformers checkpoint's tokenizer (downloaded and cached by transformers as
    usual), its tokenizer.json inlined as 'hf_tokenizer'; one line where there is none."""
    AutoTokenizer = optional_package("transformers", where, "pip install -e '.[hf]'").AutoTokenizer
    found = hf_checkpoint(name, where)
    try:
        tok = AutoTokenizer.from_pretrained(found)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{where}: no transformers tokenizer could be loaded ({str(e).splitlines()[0][:160]})"
        ) from None
    if not tok.is_fast:
        raise ValueError(f"{where} has no fast tokenizer (tokenizer.json), which nanorope runs")
    eos = tok.eos_token_id
    start = tok.bos_token_id if tok.bos_token_id is not None else eos
    fields = {
        "tokenizer": "hf",
        "hf_name": name,
        "hf_tokenizer": tok.backend_tokenizer.to_str(),
        "start_id": 0 if start is None else start,
    }
    return fields | ({"eot": eos} if eos is not None else {})
