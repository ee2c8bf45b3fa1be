"""What the published/ table scripts share: a template record from the shared file, and the
output format (a JSON array, one compact record per line)."""
import json


def template(shared_path, run_id):
    """A deep copy of the shared file's run `run_id`, to fill in."""
    with open(shared_path) as f:
        run = next(r for r in json.load(f) if r['id'] == run_id)
    return json.loads(json.dumps(run))


def write_runs(out_path, runs):
    with open(out_path, 'w') as out:
        out.write('[\n' + ',\n'.join(json.dumps(r, separators=(',', ':')) for r in runs) + '\n]\n')
    print(f'{len(runs)} runs -> {out_path}')
