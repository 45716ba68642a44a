"""Bootstrap renderers and handler (docs/rules.md#bootstrap)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bigfleet_trio.operator.bootstrap import (
    DEFAULT_BOOTSTRAP_TTL_SECONDS,
    BootstrapHandler,
    BootstrapRenderError,
    BootstrapTemplateError,
    FileRenderer,
    Requirement,
    StubRenderer,
    make_renderer,
    operator_string,
    requirements_from_proto,
)
from bigfleet_trio.proto import pb

Op = pb.NodeSelectorRequirementOperator


def _req(request_id: str = "r-1", cluster_id: str = "") -> pb.BootstrapRequest:
    return pb.BootstrapRequest(
        request_id=request_id,
        cluster_id=cluster_id,
        requirements=[
            pb.NodeSelectorRequirement(
                key="topology.kubernetes.io/zone", operator=Op.OPERATOR_IN, values=["a", "b"]
            ),
            pb.NodeSelectorRequirement(key="gpu", operator=Op.OPERATOR_DOES_NOT_EXIST),
        ],
    )


def test_stub_renderer_bytes() -> None:
    assert StubRenderer().render("prod-1", "r", []) == (
        b"#cloud-config\n# bigfleet stub bootstrap for prod-1\n"
    )


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (Op.OPERATOR_UNSPECIFIED, ""),
        (Op.OPERATOR_IN, "In"),
        (Op.OPERATOR_NOT_IN, "NotIn"),
        (Op.OPERATOR_EXISTS, "Exists"),
        (Op.OPERATOR_DOES_NOT_EXIST, "DoesNotExist"),
        (Op.OPERATOR_SAME, "Same"),
        (99, ""),
    ],
)
def test_operator_string(op: int, expected: str) -> None:
    assert operator_string(op) == expected


def test_requirements_from_proto() -> None:
    assert requirements_from_proto(_req().requirements) == [
        Requirement("topology.kubernetes.io/zone", "In", ("a", "b")),
        Requirement("gpu", "DoesNotExist", ()),
    ]


def test_file_renderer_context() -> None:
    tmpl = (
        "#cloud-config\n"
        "# cluster={{ cluster_id }} request={{ request_id }}\n"
        "{% for r in requirements %}# {{ r.key }} {{ r.operator }} {{ r.values | join(',') }}\n"
        "{% endfor %}"
    )
    out = FileRenderer(tmpl).render("c1", "r-9", requirements_from_proto(_req().requirements))
    assert out == (
        b"#cloud-config\n# cluster=c1 request=r-9\n"
        b"# topology.kubernetes.io/zone In a,b\n# gpu DoesNotExist \n"
    )


def test_syntax_error_is_clear_startup_error(tmp_path: Path) -> None:
    path = tmp_path / "bootstrap.tmpl"
    path.write_text("line one\n{% for x in %}\n")
    with pytest.raises(BootstrapTemplateError) as info:
        make_renderer(path)
    msg = str(info.value)
    assert msg.startswith(f"parse bootstrap-template-file {path}: line 2:")


def test_missing_file_is_clear_startup_error(tmp_path: Path) -> None:
    with pytest.raises(BootstrapTemplateError, match="read bootstrap-template-file"):
        make_renderer(tmp_path / "nope.tmpl")


def test_make_renderer_empty_is_stub() -> None:
    assert isinstance(make_renderer(None), StubRenderer)
    assert isinstance(make_renderer(""), StubRenderer)


def test_make_renderer_file(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_text("hello {{ cluster_id }}")
    assert make_renderer(path).render("x", "r", []) == b"hello x"


def test_undefined_is_an_error() -> None:
    with pytest.raises(BootstrapRenderError, match="UndefinedError"):
        FileRenderer("{{ token }}").render("c", "r", [])


@pytest.mark.parametrize(
    "tmpl",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cluster_id.__class__ }}",
        "{{ requirements.__class__.__init__.__globals__ }}",
        "{{ '{0.__class__}'.format(cluster_id) }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    ],
)
def test_sandbox_refuses_python_internals(tmpl: str) -> None:
    with pytest.raises(BootstrapRenderError):
        FileRenderer(tmpl).render("c", "r", [])


@pytest.mark.parametrize(
    "tmpl",
    [
        '{% include "/etc/passwd" %}',
        '{% import "/etc/passwd" as p %}',
        '{% extends "/etc/hosts" %}',
    ],
)
def test_sandbox_cannot_read_files(tmpl: str) -> None:
    with pytest.raises(BootstrapRenderError):
        FileRenderer(tmpl).render("c", "r", [])


def test_oversized_output_is_render_error() -> None:
    with pytest.raises(BootstrapRenderError, match="bytes"):
        FileRenderer("{% for i in range(2000) %}{{ 'x' * 1000 }}{% endfor %}").render("c", "r", [])


async def test_handler_success_echoes_request_id_and_ttl() -> None:
    h = BootstrapHandler(FileRenderer("{{ cluster_id }}/{{ request_id }}"), "ours")
    resp = await h.on_bootstrap_request(_req("req-7", cluster_id="ours"))
    assert resp == pb.BootstrapBlobResponse(
        request_id="req-7", user_data=b"ours/req-7", ttl_seconds=600
    )
    assert DEFAULT_BOOTSTRAP_TTL_SECONDS == 600


async def test_handler_custom_ttl_and_stub() -> None:
    h = BootstrapHandler(StubRenderer(), "c9", ttl_seconds=120)
    resp = await h.on_bootstrap_request(_req("a"))
    assert resp.user_data == b"#cloud-config\n# bigfleet stub bootstrap for c9\n"
    assert resp.ttl_seconds == 120
    assert resp.error == ""


async def test_handler_render_error_goes_in_error_field() -> None:
    h = BootstrapHandler(FileRenderer("{{ nope }}"), "c")
    resp = await h.on_bootstrap_request(_req("req-x"))
    assert resp.request_id == "req-x"
    assert resp.user_data == b""
    assert resp.ttl_seconds == 0
    assert "render bootstrap template" in resp.error and "nope" in resp.error


async def test_handler_uses_configured_cluster_id_not_request() -> None:
    h = BootstrapHandler(FileRenderer("{{ cluster_id }}"), "ours")
    resp = await h.on_bootstrap_request(_req("r", cluster_id="theirs"))
    assert resp.user_data == b"ours"


def test_negative_ttl_rejected() -> None:
    with pytest.raises(ValueError):
        BootstrapHandler(StubRenderer(), "c", ttl_seconds=-1)
