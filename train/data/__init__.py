"""Data pipeline: read conversations, render with the chat template + assistant-only mask, draft vocab, batches."""

from draftsmith.train.data.conversations import Conversation, DataError, ReadStats, read_conversations, split_heldout
from draftsmith.train.data.dataset import PreparedData, collate, make_batches, prepare_data
from draftsmith.train.data.render import Sample, render, render_prompt
from draftsmith.train.data.vocab import DraftVocab, build_draft_vocab, count_supervised, coverage_report

__all__ = [
    "Conversation",
    "DataError",
    "ReadStats",
    "read_conversations",
    "split_heldout",
    "Sample",
    "render",
    "render_prompt",
    "DraftVocab",
    "build_draft_vocab",
    "count_supervised",
    "coverage_report",
    "PreparedData",
    "prepare_data",
    "make_batches",
    "collate",
]
