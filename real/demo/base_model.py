"""Build the demo's tiny base model: a Llama that read the world's encyclopedia.

``real-demo build-base --output DIR`` trains it from scratch on CPU, seeded,
logging the exact-answer curve to ``DIR/build_log.jsonl``. Its data mixes

- the encyclopedia (every fact sentence; language-model loss): the model
  *knows* the world, as an LLM knows Wikipedia;
- claim-only questions answered from that knowledge (knowledge prompt);
- evidence prompts with full pools, answered with the label and the id of the
  matching line: the model can *read*;
- evidence prompts whose matching line is missing, answered from knowledge —
  the habit of instruction-tuned LLMs that FAE exposes and REAL removes.

The verifier prompts are the framework's own (SPEC §3), rendered with a
Llama-3 chat template, so the demo fine-tunes and evaluates this base through
exactly the code paths used for Llama-3.1-8B-Instruct.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

from real_fae_core.atomicio import atomic_file, atomic_write_json
from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.runlock import RunLock
from data_prep.prompts import (
    EVIDENCE_SYSTEM_PROMPT,
    KNOWLEDGE_SYSTEM_PROMPT,
    format_answer,
    parse_answer,
    render_chat,
    render_evidence_prompt,
    render_knowledge_prompt,
)
from data_prep.records import LABELS, REFUTE, SUPPORT, ClaimRecord

from .world import World, build_world, make_record

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>", "<|finetune_right_pad_id|>", "[UNK]"]
MAX_LINE_ID = 32


def llama3_chat_template() -> str:
    """The Llama-3 chat template that TRL ships, so the demo model chats as a Llama-3 model does."""
    from importlib import resources

    return resources.files("trl").joinpath("chat_templates", "llama3.jinja").read_text()


def build_word_tokenizer(world: World):
    """Word-level tokenizer: every entity, value, prompt word and answer piece is one token."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words: list[str] = list(SPECIALS)
    pieces = set(world.words())
    pieces |= {"Claim:", "Document:", "system", "user", "assistant", "true", "false", "find"}
    pieces |= {f"line{i}:" for i in range(MAX_LINE_ID)}
    for label in LABELS:
        pieces |= set(format_answer(label, []).split())
    for i in range(MAX_LINE_ID):
        pieces |= set(format_answer(SUPPORT, [i]).split()) | {f"[{i},", f"{i},", f"{i}]}}"}
    words += sorted(pieces - set(words))
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
        unk_token="[UNK]",
    )
    # Each of the framework's two fixed system prompts is one token for this toy
    # word-level model: the rendered text is unchanged, sequences are half as long
    # (and CPU training twice as fast).
    hf.add_special_tokens({"additional_special_tokens": [t for t in SPECIALS if t not in hf.all_special_tokens]})
    # Likewise "capital of Zorvia" (attribute + entity) is one phrase token: finding the
    # line that speaks about the claim's subject becomes token identity, which a
    # 4-layer model learns in minutes instead of hours.
    phrases = [EVIDENCE_SYSTEM_PROMPT, KNOWLEDGE_SYSTEM_PROMPT]
    phrases += [f"{fact.attribute} of {fact.entity}" for fact in world.facts.values()]
    hf.add_tokens([AddedToken(p, single_word=True, normalized=False) for p in phrases])
    hf.chat_template = llama3_chat_template()
    return hf


@dataclass
class Example:
    ids: list[int]
    loss_from: int  # positions >= loss_from carry loss (0 = whole sequence)
    loss_positions: list[int] | None = None  # when set, only these positions carry loss


class ExampleFactory:
    """Draws training examples of the four kinds, tokenized."""

    def __init__(self, world: World, tokenizer, rng: random.Random):
        self.world, self.tok, self.rng = world, tokenizer, rng
        self.facts = list(world.facts.values())
        self.eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")

    def _chat(self, messages, answer: str) -> Example:
        prompt = self.tok(render_chat(self.tok, messages), add_special_tokens=False)["input_ids"]
        target = self.tok(answer, add_special_tokens=False)["input_ids"] + [self.eot]
        return Example(prompt + target, len(prompt))

    def encyclopedia(self, n_facts: int = 8) -> Example:
        """Several facts packed into one sequence (no padding waste)."""
        text = " ".join(f.sentence() for f in self.rng.sample(self.facts, n_facts))
        return Example(self.tok(text, add_special_tokens=False)["input_ids"] + [self.eot], 0)

    def quiz(self, n: int = 8) -> Example:
        """Packed true/false statements: dense practice at comparing a value with memory."""
        words = []
        for fact in self.rng.sample(self.facts, n):
            true = self.rng.random() < 0.5
            value = fact.value if true else self.rng.choice([v for v in self.world.values[fact.attribute]
                                                             if v != fact.value])
            words += [fact.sentence(value), "true" if true else "false"]
        ids = self.tok(" ".join(words), add_special_tokens=False)["input_ids"]
        marks = {self.tok.convert_tokens_to_ids("true"), self.tok.convert_tokens_to_ids("false")}
        return Example(ids, 0, [j for j, t in enumerate(ids) if t in marks])

    def lookup(self, n_lines: int = 6, n_queries: int = 4) -> Example:
        """Numbered lines then "find <subject> lineK:" queries: dense practice at finding a line."""
        facts = self.rng.sample(self.facts, n_lines)
        ids_ = self.rng.sample(range(16), n_lines)
        words = [f"line{k}: {f.sentence()}" for k, f in zip(ids_, facts)]
        for q in self.rng.sample(range(n_lines), n_queries):
            words.append(f"find {facts[q].attribute} of {facts[q].entity} line{ids_[q]}:")
        ids = self.tok(" ".join(words), add_special_tokens=False)["input_ids"]
        find = self.tok.convert_tokens_to_ids("find")
        return Example(ids, 0, [j + 2 for j, t in enumerate(ids) if t == find])

    def repeat(self, n: int = 24) -> Example:
        """A random token run, then the same run again: dense practice at copying from context
        (the induction circuit that line lookup is built from)."""
        pool = self._token_pool()
        run = [self.rng.choice(pool) for _ in range(n)]
        return Example(run + run, 0, list(range(n + 1, 2 * n)))

    def _token_pool(self) -> list[int]:
        if not hasattr(self, "_pool"):
            names = [f"{f.attribute} of {f.entity}" for f in self.facts] + [f"line{i}:" for i in range(16)]
            names += [v for vals in self.world.values.values() for v in vals]
            self._pool = self.tok.convert_tokens_to_ids(names)
        return self._pool

    def record(self) -> ClaimRecord:
        """A claim record about a random fact of the world, SUPPORT or REFUTE at even odds, a pool of 2-6 lines."""
        fact = self.rng.choice(self.facts)
        label = SUPPORT if self.rng.random() < 0.5 else REFUTE
        return make_record(self.world, fact, label, self.rng, self.rng.randint(2, 6), "x")

    def knowledge(self) -> Example:
        """A claim-only chat example: the label from the model's own knowledge, no evidence cited."""
        rec = self.record()
        return self._chat(render_knowledge_prompt(rec), format_answer(rec.label, []))

    def full_pool(self) -> Example:
        """An evidence chat example over the whole pool: the label and the gold line ids."""
        rec = self.record()
        return self._chat(render_evidence_prompt(rec), format_answer(rec.label, rec.gold_ids))

    abstain_share = 0.0  # share of missing-line prompts answered NOT_ENOUGH_INFO

    def missing_gold(self) -> Example:
        """An evidence chat example with the gold lines removed: NOT_ENOUGH_INFO (``abstain_share`` of the time)
        or the label from knowledge, nothing cited."""
        rec = self.record()
        pool = [i for i in rec.pool_ids if i not in rec.gold_ids]
        label = "NOT_ENOUGH_INFO" if self.rng.random() < self.abstain_share else rec.label
        return self._chat(render_evidence_prompt(rec, pool), format_answer(label, []))

    def draw(self) -> Example:
        """One example of a kind drawn at the base model's fixed mix (text, copying, quizzes, lookups, chats)."""
        r = self.rng.random()
        if r < 0.10:
            return self.encyclopedia()
        if r < 0.30:
            return self.repeat()
        if r < 0.45:
            return self.quiz()
        if r < 0.65:
            return self.lookup(n_lines=8, n_queries=8)
        if r < 0.70:
            return self.knowledge()
        if r < 0.95:
            return self.full_pool()
        return self.missing_gold()


def collate(batch: list[Example], pad_id: int):
    """(input ids, attention mask, labels) of a batch, right-padded with ``pad_id``; labels are -100 wherever
    an example carries no loss."""
    import torch

    n = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), n), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), n), -100, dtype=torch.long)
    attn = torch.zeros((len(batch), n), dtype=torch.long)
    for i, e in enumerate(batch):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        attn[i, : len(e.ids)] = 1
        if e.loss_positions is not None:
            for j in e.loss_positions:
                labels[i, j] = e.ids[j]
        else:
            labels[i, e.loss_from : len(e.ids)] = torch.tensor(e.ids[e.loss_from :])
    return ids, attn, labels


def exact_answer_rate(model, tokenizer, records: list[ClaimRecord], pools=None, batch_size: int = 64) -> float:
    """Share of records answered exactly (label and cited ids) by greedy decoding."""
    import torch

    tokenizer.padding_side = "left"
    hits = 0
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        texts = [render_chat(tokenizer, render_evidence_prompt(r, None if pools is None else pools[start + k]))
                 for k, r in enumerate(chunk)]
        enc = tokenizer(texts, add_special_tokens=False, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=8, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        for k, r in enumerate(chunk):
            text = tokenizer.decode(out[k, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            pool = r.pool_ids if pools is None else pools[start + k]
            p = parse_answer(text, pool)
            want_ids = [i for i in r.gold_ids if i in pool]
            want_label = r.label
            hits += int(p.valid and p.label == want_label and sorted(p.cited) == want_ids and not p.hallucinated)
    return hits / max(1, len(records))


def build_base(
    output_dir: str | Path,
    *,
    steps: int = 18000,
    schedule_steps: int | None = 40000,
    final_phase_from: int | None = 17000,
    stop_after: int | None = None,
    batch_size: int = 32,
    lr: float = 2e-3,
    hidden_size: int = 128,
    num_layers: int = 4,
    seed: int = 0,
    eval_every: int = 1000,
    target: float = 0.97,
    abstain_from_step: int = 17000,
    abstain_share: float = 0.15,
    command: str | None = None,
    log=print,
) -> dict:
    """Train the base from scratch; stops early once full-pool exact answers reach ``target``.

    The defaults are the shipped base's schedule (:func:`lr_lambda`): cosine
    over ``schedule_steps`` = 40,000 up to step ``final_phase_from`` = 17,000,
    then cosine over ``steps`` = 18,000 to the end. That is what the shipped
    build did by hand (a 40,000-step build stopped after step 17,000, resumed
    with ``--steps 18000``), as one command. ``schedule_steps=None`` (or
    ``final_phase_from=None``) is one cosine over ``steps``.

    Resumable: rerunning with the same ``output_dir`` continues from the last
    evaluation (``resume_state.pt``), so a long CPU build survives interruptions;
    the resumed run uses the schedule it is given. ``stop_after=K`` ends the run
    after step K (evaluated and checkpointed), as stopping it by hand would.
    """
    import torch

    t0 = time.time()
    model, tok, factory, eval_full = _fresh_base(seed, hidden_size, num_layers)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps, schedule_steps, final_phase_from))
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # One builder per output: two builds into one directory would interleave their checkpoints.
    with RunLock(output_dir, "real-demo build-base", is_dir=True):
        log_path = output_dir / "build_log.jsonl"
        resume_path = output_dir / "resume_state.pt"  # optimizer + RNG; not part of the shipped model
        best, start, elapsed0, final_saved, running = -1.0, 1, 0.0, False, None
        if resume_path.exists():
            best, start, elapsed0, final_saved, running = _resume(resume_path, model, opt, sched, factory)
            log(f"resuming from step {start - 1} (best exact {best:.3f})")
        log_fh = log_path.open("a")
        step = start - 1
        for step in range(start, steps + 1):
            # Final phase: the base also learns the NOT_ENOUGH_INFO answer, used for a
            # minority of missing-line prompts (greedy still answers from memory), as an
            # instruction-tuned LLM sometimes abstains.
            factory.abstain_share = abstain_share if step > abstain_from_step else 0.0
            loss = _train_step(model, opt, sched, factory, tok, batch_size)
            running = loss if running is None else 0.98 * running + 0.02 * loss
            if step % eval_every == 0 or step == steps or step == stop_after:
                elapsed = elapsed0 + time.time() - t0
                exact = _evaluate(model, tok, eval_full, step, running, elapsed, log_fh, log)
                in_final = step > abstain_from_step
                if exact >= best or (in_final and not final_saved):  # the shipped model has seen the final phase
                    best = exact
                    final_saved = final_saved or in_final
                    _save(model, tok, output_dir)
                _save_resume_state(resume_path, model, opt, sched, factory, best=best, step=step, elapsed=elapsed,
                                   final_saved=final_saved, running=running)
                if (exact >= target and step > abstain_from_step) or step == stop_after:
                    break
        log_fh.close()
        info = {"seed": seed, "steps": step, "command": command or "(called from Python)",
                "schedule": schedule_info(steps, schedule_steps, final_phase_from),
                "batch_size": batch_size, "lr": lr, "hidden_size": hidden_size,
                "num_layers": num_layers, "abstain_from_step": abstain_from_step, "abstain_share": abstain_share,
                "best_exact_full_pool": best,
                "wall_seconds": round(elapsed0 + time.time() - t0, 1),
                "parameters": sum(p.numel() for p in model.parameters())}
        atomic_write_json(output_dir / "build_info.json", info)
        return info



def _fresh_base(seed: int, hidden_size: int, num_layers: int):
    """(model, tokenizer, example factory, full-pool eval records) of a new build; seeded in this order."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    world = build_world(seed=seed)
    tok = build_word_tokenizer(world)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=512, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(config)
    factory = ExampleFactory(world, tok, random.Random(seed + 1))
    eval_rng = random.Random(seed + 2)
    eval_full = [make_record(world, f, SUPPORT if eval_rng.random() < 0.5 else REFUTE, eval_rng,
                             eval_rng.randint(3, 6), f"e{i}")
                 for i, f in enumerate(eval_rng.sample(list(world.facts.values()), 256))]
    return model, tok, factory, eval_full


def _evaluate(model, tok, eval_full, step: int, running: float, elapsed: float, log_fh, log) -> float:
    """Exact full-pool answers now; one line in build_log.jsonl and the log."""
    model.eval()
    exact = exact_answer_rate(model, tok, eval_full)
    entry = {"step": step, "loss": round(running, 4), "exact_full_pool": exact, "seconds": round(elapsed, 1)}
    log_fh.write(json.dumps(entry) + "\n")
    log_fh.flush()
    log(json.dumps(entry))
    return exact


def _train_step(model, opt, sched, factory, tok, batch_size: int) -> float:
    """One optimizer step on a fresh batch; its loss."""
    import torch

    model.train()
    ids, attn, labels = collate([factory.draw() for _ in range(batch_size)], tok.pad_token_id)
    loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def _resume(path: Path, model, opt, sched, factory):
    """Load a build's resume state; (best, next step, elapsed, final_saved, running loss)."""
    import torch

    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    factory.rng.setstate(state["data_rng"])
    torch.set_rng_state(state["torch_rng"])
    # the loss curve continues (states of older builds lack "running")
    return state["best"], state["step"] + 1, state["elapsed"], state.get("final_saved", False), state.get("running")


def _save_resume_state(path: Path, model, opt, sched, factory, **progress) -> None:
    """Optimizer, scheduler and RNG states with the progress so far (not part of the shipped model)."""
    import torch

    with atomic_file(path) as tmp:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "data_rng": factory.rng.getstate(),
                    "torch_rng": torch.get_rng_state(), **progress}, tmp)

def cosine_lambda(length: int):
    """Warm-up (500 steps, at most a tenth of ``length``), then cosine from 1 to 0.05 over ``length`` steps."""
    warmup = max(1, min(500, length // 10))
    return lambda s: min(1.0, (s + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / length))))


def lr_lambda(steps: int, schedule_steps: int | None = None, final_phase_from: int | None = None):
    """The LR multiplier at scheduler step ``s``: cosine over ``schedule_steps`` up to step
    ``final_phase_from``, cosine over ``steps`` after it (one cosine over ``steps`` if either is None).

    This is what stopping a ``schedule_steps`` build after ``final_phase_from`` and
    resuming it with ``steps`` did: the resumed LambdaLR recomputes every later
    multiplier with the new length, and the optimizer restores the last one used.
    """
    if schedule_steps is None or final_phase_from is None:
        return cosine_lambda(steps)
    first, final = cosine_lambda(schedule_steps), cosine_lambda(steps)
    return lambda s: first(s) if s <= final_phase_from else final(s)


def schedule_info(steps: int, schedule_steps: int | None, final_phase_from: int | None) -> dict:
    """The schedule as build_info.json records it."""
    if schedule_steps is None or final_phase_from is None:
        return {"kind": "cosine", "length": steps, "warmup": max(1, min(500, steps // 10))}
    return {"kind": "cosine, then a final cosine", "schedule_steps": schedule_steps,
            "warmup": max(1, min(500, schedule_steps // 10)), "final_phase_from": final_phase_from,
            "final_length": steps, "steps": steps,
            "lr_lambda": f"cosine over {schedule_steps} steps for s <= {final_phase_from}, "
                         f"cosine over {steps} steps after (base_model.lr_lambda)"}


def _save(model, tok, output_dir: Path) -> None:
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        eos_token_id=[tok.eos_token_id], pad_token_id=tok.pad_token_id, do_sample=False
    )
    model.save_pretrained(output_dir)
    tok.save_pretrained(output_dir)


@dataclass
class BuildBaseConfig(CommandConfig):
    """`real-demo build-base`: the demo's base model from scratch (seeded, CPU; resumable)."""

    output: str = option(help="directory for the model, tokenizer and build_log.jsonl")
    steps: int = option(18000, min=1, help="training steps; the final cosine phase ends here (default 18000, the "
                                           "shipped base)")
    schedule_steps: int = option(40000, min=1, help="length of the first cosine, used up to --final-phase-from "
                                                    "(default 40000)")
    final_phase_from: int = option(17000, min=-1, help="after this step the LR follows a cosine over --steps "
                                                       "(default 17000); -1 = one cosine over --steps")
    stop_after: int | None = option(None, min=1, help="end after this step (checkpointed: rerun to resume)")
    seed: int = 0
    target: float = option(0.97, above=0.0, max=1.0,
                           help="stop once this share of held-out full-pool answers is exact")


CONFIG = BuildBaseConfig


def run(config: BuildBaseConfig, *, command: str | None = None) -> CommandResult:
    """`real-demo build-base` as a function; ``summary`` is what the build reports."""
    final = None if config.final_phase_from < 0 else config.final_phase_from
    info = build_base(config.output, steps=config.steps, schedule_steps=config.schedule_steps,
                      final_phase_from=final, stop_after=config.stop_after, seed=config.seed,
                      target=config.target, command=command)
    print(info)
    return CommandResult(outputs={"output": str(config.output)}, summary=info)
