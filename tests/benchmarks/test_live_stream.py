"""The live benchmark's stream (benchmarks.live): what it sends is new spans, whatever the shape."""

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from benchmarks.generator import Shape, stamp, template_payloads
from benchmarks.live import Resends, _at


def _spans(payload: bytes) -> list:
    request = ExportTraceServiceRequest.FromString(payload)
    return [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]


def _runs(payload: bytes) -> set[str]:
    return {
        a.value.string_value
        for s in _spans(payload)
        for a in s.attributes
        if a.key == "gen_ai.conversation.id"
    }


def test_a_request_drawn_again_goes_to_new_runs_each_trace_still_whole():
    payloads = template_payloads(400, seed=3, batch_size=20, shape=Shape(calls_per_session=10))
    resends, stored_copies = Resends(), 8
    sent = {}
    for epoch_expected in range(3):
        for index in range(len(payloads)):
            epoch = resends.next(index, 5)
            assert epoch == epoch_expected
            namespace = Resends.namespace(5, epoch, stored_copies)
            assert (namespace == 5) == (epoch == 0) and (epoch == 0 or namespace > stored_copies)
            sent[(index, epoch)] = _at(stamp(payloads[index], namespace), None)
    assert resends.draws() == {"total": 3 * len(payloads), "again": 2 * len(payloads)}
    ids = [(s.trace_id, s.span_id) for payload in sent.values() for s in _spans(payload)]
    assert len(ids) == len(set(ids)), "a draw again stored nothing new"
    runs = [_runs(payload) for payload in sent.values()]
    for index in range(len(payloads)):  # a first draw continues the copy's runs, a later one others
        assert sent[(index, 0)] == stamp(payloads[index], 5)
        assert not _runs(sent[(index, 0)]) & _runs(sent[(index, 2)])
    assert len(set().union(*runs)) == 3 * len(
        set().union(*(_runs(sent[(i, 0)]) for i in range(len(payloads))))
    )
    # a trace whose spans two requests carry is one trace again in the same epoch
    for epoch in (0, 2):
        spans = [s for (_, e), payload in sent.items() if e == epoch for s in _spans(payload)]
        known = {(s.trace_id, s.span_id) for s in spans}
        assert all((s.trace_id, s.parent_span_id) in known for s in spans if s.parent_span_id)
