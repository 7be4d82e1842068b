"""Reading calibration evidence (ROC points) out of a threshold's provenance."""

from __future__ import annotations

import pandas as pd


def roc_points(provenance) -> tuple[pd.DataFrame | None, float | None]:
    """ROC points (``fpr``, ``tpr``, optional ``threshold``) and AUC from a provenance object.

    Accepts ``{"roc": {"fpr": [...], "tpr": [...], "thresholds": [...]}}``, ``{"roc": [{fpr, tpr,
    threshold}, ...]}`` and the same under ``metrics``; anything else gives ``(None, None)``.
    """
    if not isinstance(provenance, dict):
        return None, None
    holder = provenance.get("metrics") if isinstance(provenance.get("metrics"), dict) else {}
    roc = provenance.get("roc") or provenance.get("roc_curve") or holder.get("roc") or holder.get("roc_curve")
    auc = provenance.get("auc") or provenance.get("roc_auc") or holder.get("auc") or holder.get("roc_auc")
    if isinstance(roc, dict) and "fpr" in roc and "tpr" in roc:
        frame = pd.DataFrame({"fpr": roc["fpr"], "tpr": roc["tpr"]})
        thresholds = roc.get("thresholds") or roc.get("threshold")
        if thresholds is not None and len(thresholds) == len(frame):
            frame["threshold"] = thresholds
    elif isinstance(roc, list) and roc and isinstance(roc[0], dict):
        frame = pd.DataFrame(roc)
        if not {"fpr", "tpr"} <= set(frame.columns):
            return None, None
    else:
        return None, None
    frame = frame.apply(pd.to_numeric, errors="coerce").dropna(subset=["fpr", "tpr"])
    return frame.sort_values(["fpr", "tpr"]).reset_index(drop=True), (float(auc) if auc is not None else None)
