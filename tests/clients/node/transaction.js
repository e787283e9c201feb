'use strict';
// A transaction committed and one aborted, each with a SEND and an ACK in it: the same flow
// as tests/clients/ruby/transaction.rb.
//
// Session 1: SEND m0, m1; SUBSCRIBE client-individual; take m0 and m1. BEGIN tx1, SEND t1 in
// tx1, ACK m0 in tx1, COMMIT tx1 (receipt). BEGIN tx2, SEND t2 in tx2, ACK m1 in tx2, ABORT
// tx2 (receipt). SEND the marker "end1" and take (and ACK) every MESSAGE up to it: t1, never
// t2. DISCONNECT. Session 2: SUBSCRIBE ack auto, SEND "end2", take every MESSAGE up to it:
// m1 (its ACK was aborted), never m0 (its ACK was committed).
// Result: {"received": [...], "after": [...], "left": [...]}.

const { options, run, describe, Session } = require('./common');

const opts = options();
run('transaction', opts.timeout, async (result) => {
  const dest = opts.dest;
  const first = await Session.open(opts, result);
  await first.send(dest, 'm0', { persistent: 'true' });
  await first.send(dest, 'm1', { persistent: 'true' }, true);
  first.subscribe({ destination: dest, id: 's1', ack: 'client-individual' });
  const m0 = await first.message();
  const m1 = await first.message();
  result.data.received = [m0, m1].map(describe);

  const tx1 = first.begin('tx1');
  await Session.write(tx1.send({ destination: dest, persistent: 'true' }), 't1');
  await first.ack(m0, { transaction: 'tx1' });
  await first.finish(tx1, 'commit');

  const tx2 = first.begin('tx2');
  await Session.write(tx2.send({ destination: dest, persistent: 'true' }), 't2');
  await first.ack(m1, { transaction: 'tx2' });
  await first.finish(tx2, 'abort');

  await first.send(dest, 'end1', {}, true);
  result.data.after = (await first.untilMarker('end1', true)).map(describe);
  await first.close();

  const second = await Session.open(opts, result);
  second.subscribe({ destination: dest, id: 's2', ack: 'auto' });
  await second.send(dest, 'end2', {}, true);
  result.data.left = (await second.untilMarker('end2')).map(describe);
  await second.close();
});
