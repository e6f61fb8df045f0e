"""What one `make_dataset` call reads from the recorded dataset, gathered in one pass.

    path, split, features, label, text=, missing= (the call's own words)
      -> the datasets it names, their metadata, one view of them (_info.load_spans)
      -> the split (every span has it), its shard files there (listed, not opened)
      -> the label, its classes (the same in every span), the features read
      -> text ids (each vocabulary read and checked), missing-value masks
      -> Facts: what the pipeline's Request takes from the metadata

Every refusal names the dataset and the fix. Only the checks that need the metadata are
here; those of the call alone (batch_size, options, the service) run before, in
`ingest.pipeline._request`, which reads nothing but `Facts` from the recorded dataset.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Mapping

from ingest import contract
from ingest.metadata import _files, _info, _spans
from ingest.names import did_you_mean

__all__ = ["Facts", "gather", "text_codes", "TEXT_MODES"]

logger = logging.getLogger(__name__)

TEXT_MODES = ("strings", "ids")


@dataclasses.dataclass(frozen=True)
class Facts:
    """The recorded dataset as one call reads it: checked, its defaults resolved."""

    info: contract.DatasetInfo  # the merged view of every span read
    root: str  # the datasets' directory (the first span's, for several)
    split: contract.SplitInfo
    label: str | None  # the feature yielded apart as the label
    label_classes: tuple  # a text label's classes, when it is yielded as their index; else ()
    images: bool  # whether the graph decodes the dataset's images
    features: tuple  # the features parsed, the label included
    text_codes: bool | None  # whether the blocks' bytes columns carry dictionary codes (None: each says)
    text_ids: Mapping  # {text feature yielded as ids: its vocabulary's size}
    masks: Mapping  # {feature: its missing-value mask's name}


def gather(
    path,
    *,
    split: str,
    features,
    label,
    label_ids: bool,
    image_given: bool,
    raw: bool,
    skip_corrupt: bool,
    text: str,
    missing: str,
) -> Facts:
    """Reads the metadata `path` names and checks the call against it, in the order a user
    would fix things: the split, its shards, the label, the features, text ids, masks."""
    view = _info.load_spans(path)
    info = view.info
    where = view.root if len(view.paths) == 1 else f"the {len(view.paths)} datasets {', '.join(view.paths)}"
    split_info = _split_of(info, where, split)
    lacking = [p for p, i in zip(view.paths, view.infos) if not any(s.name == split for s in i.splits)]
    if lacking and len(view.paths) > 1:
        raise ValueError(
            f"split {split!r} is missing from {len(lacking)} of {where}: {', '.join(lacking)}; reading the others "
            "would leave those spans out. Read a split every span has, or leave those spans out of the list"
        )
    for span, span_info in zip(view.paths, view.infos):
        _check_shards_exist(span, span_info.split(split), skip_corrupt=skip_corrupt)
    label = _label_of(info, where, label)
    if label_ids:
        _check_span_classes(view, label, where)
    images = not raw and _decodes_images(info, where, features, image_given)
    selected = _selected_features(info, where, features, label, images)
    return Facts(
        info=info,
        root=view.root,
        split=split_info,
        label=label,
        label_classes=_label_classes(info, label, where) if label_ids else (),
        images=images,
        features=tuple(selected),
        text_codes=text_codes(view.infos),
        text_ids=_text_ids(view, selected, label, text, where),
        masks=_masks(info, selected, missing, where) if not images and not raw else {},
    )


def _masks(info: contract.DatasetInfo, selected, missing: str, path) -> dict:
    """{feature: its mask's name} for the selected features the metadata records missing
    values for (spans: in any of them), under missing="mask"."""
    modes, suffix = contract.MISSING_MODES, contract.MASK_SUFFIX
    if missing not in modes:
        raise ValueError(
            f"missing must be one of {modes}, got {missing!r}: 'mask' adds NAME{suffix} (True where "
            "a record lacked NAME) beside each feature that has missing values; 'fill' gives the default alone"
        )
    if missing == "fill":
        return {}
    masks = {f.name: f.name + suffix for f in info.features if f.name in selected and f.missing}
    taken = {f.name for f in info.features}  # read or not: the key would mean two things
    clash = sorted(name for name, mask in masks.items() if mask in taken)
    if clash:
        raise ValueError(
            f"{path} has a feature {clash[0] + suffix!r}, the name make_dataset gives feature {clash[0]!r}'s "
            f"missing-value mask: pass missing='fill' (the default value alone, no mask), or rename the column "
            "at conversion"
        )
    return masks


def _text_ids(view, selected, label, text: str, path) -> dict:
    """The text features `text="ids"` yields as ids: every selected bytes feature that holds
    text, each with a vocabulary in every dataset read, the same ids in all of them (a later
    span's vocabulary extends an earlier one's: --schema_from). The label yielded apart is
    not one: it comes as `label_ids` says (its class id, or its text)."""
    if text not in TEXT_MODES:
        raise ValueError(f"text must be one of {TEXT_MODES}, got {text!r}")
    if text == "strings":
        return {}
    names = [n for n in selected if n != label]
    wanted = [f for f in view.info.features if f.name in names and f.dtype == "bytes" and f.text]
    if wanted and view.info.layout != "blocks":
        raise ValueError(
            f"text='ids' reads ids the blocks layout stores; {path} has layout {view.info.layout!r}: reconvert it "
            "with --layout blocks (the default), or read text='strings'"
        )
    for f in wanted:
        for span, info in zip(view.paths, view.infos):
            if f.name not in info.vocabularies and f.name == info.label:
                raise ValueError(
                    f"text='ids': feature {f.name!r} is the label {span} records, read here among the features "
                    "(label=False, or another label named); a label has classes (load_info(path).labels), not a "
                    "vocabulary, so it has no ids. Yield it apart as the label (label=None: its class id; with "
                    "label_ids=False, its text), leave it out with features=[...], or read text='strings'"
                )
            if f.name not in info.vocabularies:
                why = next((w for w in info.warnings if w.startswith(f"text feature {f.name!r}")), None)
                why = why or f"it was converted with format_version {info.format_version}, before vocabularies (4)"
                raise ValueError(
                    f"text='ids': {span} records no vocabulary for feature {f.name!r} ({why}). Read it as strings "
                    f"(text='strings', or leave it out with features=[...]) and hash it, or reconvert {span}"
                )
        _check_vocabularies_agree(view, f.name)
    # Each vocabulary is read, and so checked (`contract.parse_vocabulary`): ids of a
    # reordered or edited file would mean other values.
    return {f.name: len(view.info.vocabulary(f.name)) for f in wanted}


def _check_vocabularies_agree(view, name: str) -> None:
    """Each dataset's vocabulary of `name` must begin the longest one (the merged view's):
    its ids mean the same values."""
    if len(view.paths) == 1:
        return
    longest = view.info.vocabulary(name)
    for span, info in zip(view.paths, view.infos):
        mine = _info.read_vocabulary(span, info, name)
        if longest[: len(mine)] != mine:
            raise ValueError(
                f"text='ids': the vocabulary of feature {name!r} in {span} is not the start of the others' "
                "(its spans were converted apart, not each with --schema_from the one before): the same id "
                "would mean other values. Reconvert the spans with --schema_from, or read text='strings'"
            )


def text_codes(infos) -> bool | None:
    """Whether the datasets' blocks carry dictionary codes for bytes columns: True, every
    block (format 3); False, none (before); None, each block says (format 4 leaves them out
    of a block whose values are all distinct, and spans converted by several formats)."""
    kinds = {
        None if i.format_version > contract.CODES_SINCE else i.format_version == contract.CODES_SINCE for i in infos
    }
    return kinds.pop() if len(kinds) == 1 else None


def _split_of(info: contract.DatasetInfo, path, split: str) -> contract.SplitInfo:
    """The split asked for, refused where it cannot be read."""
    if info.layout == "blocks" and info.image:
        # Conversion keeps images one per record; blocks of images have no reader.
        raise ValueError(
            f"{path} is an image dataset in the 'blocks' layout, which make_dataset does not read: "
            "reconvert it with --layout rows"
        )
    try:
        split_info = info.split(split)
    except KeyError as e:
        raise ValueError(e.args[0] + did_you_mean(split, [s.name for s in info.splits])) from None
    if split_info.records == 0:
        others = [f"{s.name} ({s.records} records)" for s in info.splits if s.records]
        raise ValueError(
            f"split {split!r} of {path} has no records: the conversion wrote no shard for it (see "
            f"{contract.METADATA_FILENAME}). Splits with records: {', '.join(others) or 'none'}"
        )
    return split_info


def _label_of(info: contract.DatasetInfo, path, label) -> str | None:
    """None: the recorded label; False: no label; a name: that feature."""
    names = [f.name for f in info.features]
    if label is None:
        return info.label
    if label is False:
        return None
    if label not in names:
        raise ValueError(f"label {label!r}{did_you_mean(label, names)} is not a feature of {path}; features: {names}")
    return label


def _selected_features(info: contract.DatasetInfo, path, features, label, images: bool) -> list:
    """The features parsed, the label included."""
    names = [f.name for f in info.features]
    if images:
        return [info.image["feature"]] + ([label] if label is not None else [])
    if features is None:
        return list(names)
    selected = [features] if isinstance(features, str) else list(features)  # "id": one name, not letters
    unknown = [f for f in selected if f not in names]
    if unknown:
        hint = did_you_mean(unknown[0], names)  # the first misspelling: the others are likely alike
        raise ValueError(f"features {unknown}{hint} do not exist in {path}; features: {names}")
    if label is not None and label not in selected:
        selected.append(label)
    return selected


def _check_span_classes(view, label: str | None, path: str) -> None:
    """Refuses class ids of a text label whose classes differ between spans read as one."""
    if label is None or not view.info.feature(label).text or len({i.labels for i in view.infos}) == 1:
        return
    raise ValueError(
        f"label {label!r} has other classes in some of {path}: "
        f"{'; '.join(f'{p}: {list(i.labels)}' for p, i in zip(view.paths, view.infos))}, so a class id would "
        f"mean another class in another span. {_spans.FIX} (it keeps the classes), or pass label_ids=False "
        "to read the label as text"
    )


def _label_classes(info: contract.DatasetInfo, label: str | None, path: str) -> tuple:
    """The classes a text label is yielded as the index of: those the conversion recorded."""
    spec = next((f for f in info.features if f.name == label), None)
    if spec is None or not (spec.text and spec.is_scalar):
        return ()
    if not info.labels:
        logger.warning(
            "label %r of %s is text without recorded classes (converted with --no_statistics, by an older ingest, "
            "or with more distinct values than are counted exactly): it is yielded as text",
            label,
            path,
        )
        return ()
    return tuple(info.labels)


def _check_shards_exist(path: str, split: contract.SplitInfo, *, skip_corrupt: bool) -> None:
    """Refuses (or, with skip_corrupt, announces) shard files that are gone, with one listing."""
    try:
        present = set(_files.listdir(path))
        missing = [
            s
            for s in split.shards
            if s.filename not in present and ("/" not in s.filename or not _files.exists(f"{path}/{s.filename}"))
        ]
    except OSError as e:
        logger.debug("cannot list %s (%s); missing shards will be reported as they are read", path, e)
        return
    if not missing:
        return
    names = ", ".join(f"{path}/{s.filename} ({s.records} records)" for s in missing[:3])
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    lost = sum(s.records for s in missing)
    if skip_corrupt:
        logger.warning(
            "%d shard file(s) of split %r are missing: %s%s; their %d record(s) will be skipped "
            "(and counted in skipped_corrupt_records())",
            len(missing),
            split.name,
            names,
            more,
            lost,
        )
        return
    raise FileNotFoundError(
        f"{len(missing)} shard file(s) of split {split.name!r} listed in {path}/{contract.METADATA_FILENAME} "
        f"are missing: {names}{more}. Restore them or reconvert the dataset, or pass skip_corrupt=True to "
        f"skip their {lost} record(s)."
    )


def _decodes_images(info, path, features, image_given: bool) -> bool:
    """Whether the graph decodes the dataset's images (image options given), or yields
    features as stored."""
    if not info.image:
        if image_given:
            raise ValueError(
                f"image options (image= or image_size=) are for image datasets; {path} holds no "
                f"images (features: {[f.name for f in info.features]})"
            )
        return False
    if features is not None:
        return False  # raw features asked for by name: no decoding
    if not image_given:
        raise ValueError(
            f"{path} is an image dataset: give image_size=(height, width) (or image=ingest.ImageOptions(size=...)) "
            "to decode and augment its images (training=True|False), or features=[...] to read raw features"
        )
    return True
