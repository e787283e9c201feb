'use strict';
// Send and receive in one ack mode (--ack auto|client|client-individual), then see what the
// broker still holds: the same flow as tests/clients/ruby/ack_modes.rb.
//
// Session 1: SEND m0..m3 (receipt on the last), SUBSCRIBE with --ack, take the 4 MESSAGEs,
// acknowledge per mode (client: ACK m1, cumulative; client-individual: ACK m0 and m2; auto:
// nothing), DISCONNECT. Session 2: SUBSCRIBE ack auto, SEND the marker "end", take every
// MESSAGE up to the marker: what session 1 left unacknowledged.
// Result: {"received": [...], "left": [...]}, each {"body", "headers"}.

const { options, run, describe, Session } = require('./common');

const opts = options({ ack: 'auto' });
run('ack', opts.timeout, async (result) => {
  const first = await Session.open(opts, result);
  for (let i = 0; i < 4; i += 1) {
    await first.send(opts.dest, `m${i}`, { 'x-seq': String(i), persistent: 'true' }, i === 3);
  }
  first.subscribe({ destination: opts.dest, id: 's1', ack: opts.ack });
  const received = [];
  for (let i = 0; i < 4; i += 1) {
    received.push(await first.message());
  }
  result.data.received = received.map(describe);
  if (opts.ack === 'client') {
    await first.ack(received[1]);
  } else if (opts.ack === 'client-individual') {
    await first.ack(received[0]);
    await first.ack(received[2]);
  }
  await first.close();

  const second = await Session.open(opts, result);
  second.subscribe({ destination: opts.dest, id: 's2', ack: 'auto' });
  await second.send(opts.dest, 'end', {}, true);
  result.data.left = (await second.untilMarker('end')).map(describe);
  await second.close();
});
