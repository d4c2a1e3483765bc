"""The Dockerfiles in images/, checked statically (there is no container runtime here).

Each image runs as a fixed non-root user, pins its base image (a version tag,
optionally a digest; never ``latest``, never a registry host), is built in
stages, installs with ``--no-cache-dir`` and no Debian packages in the final stage, and takes its Python pins from
hack/requirements.txt.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
DOCKERFILES = {
    "operator": ("operator/", {"8080", "8081"}),
    "trainer-cpu": ("trainer/", {"9400", "29400"}),
    "trainer-cuda": ("trainer/", {"9400", "29400"}),
}
PINS = dict(line.split("==", 1) for line in (REPO / "hack/requirements.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#"))


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(ins: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for i in ins:
        if i[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(i)
    return out


@pytest.fixture(params=sorted(DOCKERFILES))
def image(request):
    path = IMAGES / f"{request.param}.Dockerfile"
    assert path.is_file(), path
    return request.param, path, instructions(path)


def test_base_images_are_pinned_by_version(image):
    _, path, ins = image
    names = set()
    # The base is a BASE_IMAGE build argument (hack/images.sh passes a Debian-built one);
    # its default is what a user with Docker gets, and that default is pinned.
    args_default = {a.split("=", 1)[0]: a.split("=", 1)[1] for w, a in ins if w == "ARG" and "=" in a}
    assert "BASE_IMAGE" in args_default, f"{path.name}: no ARG BASE_IMAGE=<pinned default>"
    for word, args in ins:
        if word != "FROM":
            continue
        parts = args.split()
        ref = next(p for p in parts if not p.startswith("--"))
        if ref in names:
            continue  # an earlier stage
        assert ref == "${BASE_IMAGE}", f"{path.name}: FROM {ref}: every stage starts from ${{BASE_IMAGE}}"
        ref = args_default["BASE_IMAGE"]
        name, _, digest = ref.partition("@")
        repo, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "")
        host = repo.split("/")[0] if "/" in repo else ""
        assert not ("." in host or ":" in host or host == "localhost"), \
            f"{path.name}: {ref}: no registry host in a FROM line (plain image names only)"
        assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{path.name}: {ref} is not pinned to a version"
        assert not digest or re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{path.name}: bad digest in {ref}"
        if len(parts) >= 3 and parts[-2].upper() == "AS":
            names.add(parts[-1])
    assert ":latest" not in path.read_text(), f"{path.name} mentions :latest"


def test_runs_as_a_fixed_non_root_user(image):
    _, path, ins = image
    final = stages(ins)[-1]
    users = [args for word, args in final if word == "USER"]
    assert users, f"{path.name}: the final stage sets no USER"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, f"{path.name}: USER {users[-1]} (want a numeric, non-zero UID)"
    group = users[-1].split(":")[1] if ":" in users[-1] else ""
    assert not group or (group.isdigit() and int(group) != 0), f"{path.name}: group {group}"


def test_multi_stage_and_no_caches(image):
    _, path, ins = image
    assert len(stages(ins)) >= 2, f"{path.name}: build in a separate stage"
    final = stages(ins)[-1]
    assert any(w == "COPY" and args.startswith("--from=") for w, args in final), path.name
    for word, args in ins:
        if word != "RUN":
            continue
        for cmd in re.split(r"&&|;|\|\|", args):
            tokens = shlex.split(cmd.replace("${TORCH_INDEX_URL:+--index-url \"$TORCH_INDEX_URL\"}", ""))
            if len(tokens) >= 2 and tokens[0].endswith("pip") and tokens[1] == "install":
                assert "--no-cache-dir" in tokens, f"{path.name}: {cmd.strip()}"
            if tokens[:2] in (["apt-get", "install"], ["apt", "install"]):
                assert "--no-install-recommends" in tokens and "rm -rf /var/lib/apt/lists" in args, path.name
    # No build tools in the final image: it installs no Debian packages. (The CPU
    # trainer pip-installs its wheels there on purpose: one layer, written once.)
    assert not any(w == "RUN" and re.search(r"\bapt(-get)? install", args) for w, args in final), path.name


def test_python_pins_come_from_hack_requirements(image):
    variant, path, ins = image
    project, ports = DOCKERFILES[variant]
    text = " ".join(args for _, args in ins)
    assert "COPY hack/requirements.txt" in " ".join(f"{w} {a}" for w, a in ins), path.name
    selected = set()
    for pattern in re.findall(r"grep -E '\^\(?([^)']*)\)?==' hack/requirements.txt", text):
        selected |= set(pattern.split("|"))
    assert selected, f"{path.name}: selects no pins from hack/requirements.txt"
    assert selected <= set(PINS), f"{path.name}: {selected - set(PINS)} are not pinned in hack/requirements.txt"
    needs = {"operator": {"kopf", "kubernetes", "aiohttp", "pyyaml", "prometheus-client"},
             "trainer": {"torch", "numpy", "scikit-learn", "pyyaml", "prometheus-client"}}[project.strip("/")]
    assert needs <= selected, f"{path.name}: does not install {needs - selected}"
    # The project and the API package both sides share (cohort.api), without their deps.
    assert f"--no-deps ./api ./{project.strip('/')}" in text, f"{path.name}: install the projects without their deps"
    exposed = {p for w, a in ins if w == "EXPOSE" for p in a.split()}
    assert exposed == ports, f"{path.name}: EXPOSE {exposed}"
    ignore = path.with_name(path.name + ".dockerignore")
    assert ignore.is_file() and f"!{project}" in ignore.read_text() and "!api/" in ignore.read_text(), ignore


def test_build_script_prints_the_commands_without_docker():
    proc = subprocess.run([str(IMAGES / "build.sh")], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "DOCKER": "no-such-docker", "IMAGE_REGISTRY": "reg/org"})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert len(lines) == 3
    for variant in DOCKERFILES:
        assert any(f"-f images/{variant}.Dockerfile" in line for line in lines), variant
    assert any("-t reg/org/cohort-trainer:" in line and line.endswith("-cuda .") for line in lines)
